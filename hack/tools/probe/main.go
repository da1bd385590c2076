// Command probe is the pod image of the multi-node cluster's network tests (hack/cluster.sh): a server
// that answers every TCP connection with its pod's name, and a client run with `kubectl exec` that checks
// reachability by ICMP and TCP, IPv4 and IPv6. Standard library only and static (CGO_ENABLED=0), so the
// image is one file; it runs as root in the pod so ICMP can use a raw socket.
//
//	probe serve [PORT]              HTTP on [::]:PORT (default 8080): the body is $POD_NAME (or the hostname);
//	                                UDP datagrams to the same port are echoed back (hack/bench.sh forget's
//	                                flows, which need replies to become conntrack streams)
//	probe ping ADDR                 one ICMP echo; exit 0 on a reply within 2 s
//	probe get HOST:PORT             HTTP GET /; prints the body; exit 0 on 200
//	probe stream ADDR COUNT MS      COUNT echoes every MS milliseconds; prints "sent N received M"
//	probe sink [PORT]               TCP on [::]:PORT (default 5201): reads and discards, for `blast`
//	probe blast HOST:PORT SECONDS   sends to a sink for SECONDS; prints "mbit_per_s X"
//	probe rtt HOST:PORT COUNT       COUNT HTTP GETs on one kept-alive connection to `serve`; prints
//	                                "rtt_us min=A median=B max=C" (hack/bench-pod-network.sh reads both)
package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fail("usage: probe serve|ping|get|stream|sink|blast|rtt ...")
	}
	switch args := os.Args[2:]; os.Args[1] {
	case "serve":
		port := "8080"
		if len(args) > 0 {
			port = args[0]
		}
		serve(port)
	case "ping":
		need(args, 1)
		if err := ping(args[0], 1, 2*time.Second); err != nil {
			fail(err.Error())
		}
		fmt.Println("reply from", args[0])
	case "get":
		need(args, 1)
		get(args[0])
	case "stream":
		need(args, 3)
		stream(args[0], args[1], args[2])
	case "sink":
		port := "5201"
		if len(args) > 0 {
			port = args[0]
		}
		sink(port)
	case "blast":
		need(args, 2)
		blast(args[0], args[1])
	case "rtt":
		need(args, 2)
		rtt(args[0], args[1])
	default:
		fail("unknown command " + os.Args[1])
	}
}

func need(args []string, n int) {
	if len(args) < n {
		fail(fmt.Sprintf("%s needs %d arguments", os.Args[1], n))
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "probe:", msg)
	os.Exit(1)
}

func serve(port string) {
	name := os.Getenv("POD_NAME")
	if name == "" {
		name, _ = os.Hostname()
	}
	go echoUDP(port)
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, name)
	})
	// "tcp" on [::] takes both families (bindv6only is 0 in a pod's namespace).
	if err := http.ListenAndServe(":"+port, nil); err != nil {
		fail(err.Error())
	}
}

// echoUDP sends every datagram to PORT back to its sender.
func echoUDP(port string) {
	// "udp" on [::] takes both families, as serve's TCP listener does.
	c, err := net.ListenPacket("udp", ":"+port)
	if err != nil {
		fail(err.Error())
	}
	buf := make([]byte, 2048)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			fail(err.Error())
		}
		_, _ = c.WriteTo(buf[:n], from)
	}
}

func get(hostport string) {
	client := http.Client{Timeout: 3 * time.Second}
	resp, err := client.Get("http://" + hostport + "/")
	if err != nil {
		fail(err.Error())
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		fail(fmt.Sprintf("status %d", resp.StatusCode))
	}
	fmt.Println(string(body))
}

func stream(addr, count, ms string) {
	n, err1 := strconv.Atoi(count)
	every, err2 := strconv.Atoi(ms)
	if err1 != nil || err2 != nil {
		fail("COUNT and MS are integers")
	}
	received := 0
	for i := 0; i < n; i++ {
		start := time.Now()
		// Each echo has its own sequence number, so a late reply is never counted for a later echo.
		if ping(addr, i+1, time.Duration(every)*time.Millisecond*5) == nil {
			received++
		}
		if rest := time.Duration(every)*time.Millisecond - time.Since(start); rest > 0 {
			time.Sleep(rest)
		}
	}
	fmt.Printf("sent %d received %d\n", n, received)
}

// ping sends one echo request with sequence number seq and waits for its reply.
func ping(addr string, seq int, timeout time.Duration) error {
	ip := net.ParseIP(addr)
	if ip == nil {
		return fmt.Errorf("not an IP address: %s", addr)
	}
	network, typ, replyType := "ip4:icmp", byte(8), byte(0)
	if ip.To4() == nil {
		network, typ, replyType = "ip6:ipv6-icmp", 128, 129
	}
	conn, err := net.DialIP(network, nil, &net.IPAddr{IP: ip})
	if err != nil {
		return err
	}
	defer conn.Close()
	id := os.Getpid() & 0xffff
	msg := make([]byte, 16)
	msg[0] = typ
	binary.BigEndian.PutUint16(msg[4:], uint16(id))
	binary.BigEndian.PutUint16(msg[6:], uint16(seq))
	copy(msg[8:], "netcm-pb")
	if typ == 8 {
		// The kernel fills in ICMPv6 checksums itself, not ICMPv4's.
		binary.BigEndian.PutUint16(msg[2:], checksum(msg))
	}
	if _, err := conn.Write(msg); err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 1500)
	for {
		_ = conn.SetReadDeadline(deadline)
		n, err := conn.Read(buf)
		if err != nil {
			return fmt.Errorf("no reply from %s: %w", addr, err)
		}
		reply := buf[:n]
		// A raw IPv4 socket returns the IP header too.
		if typ == 8 && n >= 20 && reply[0]>>4 == 4 {
			reply = reply[int(reply[0]&0x0f)*4:]
		}
		if len(reply) >= 8 && reply[0] == replyType &&
			int(binary.BigEndian.Uint16(reply[4:])) == id && int(binary.BigEndian.Uint16(reply[6:])) == seq {
			return nil
		}
	}
}

func checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

func sink(port string) {
	ln, err := net.Listen("tcp", ":"+port)
	if err != nil {
		fail(err.Error())
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			fail(err.Error())
		}
		go func() {
			defer c.Close()
			_, _ = io.Copy(io.Discard, c)
		}()
	}
}

func blast(hostport, seconds string) {
	secs, err := strconv.Atoi(seconds)
	if err != nil {
		fail("SECONDS is an integer")
	}
	c, err := net.DialTimeout("tcp", hostport, 3*time.Second)
	if err != nil {
		fail(err.Error())
	}
	defer c.Close()
	buf := make([]byte, 128<<10)
	var sent int64
	start := time.Now()
	end := start.Add(time.Duration(secs) * time.Second)
	for time.Now().Before(end) {
		n, err := c.Write(buf)
		sent += int64(n)
		if err != nil {
			fail(err.Error())
		}
	}
	fmt.Printf("mbit_per_s %.0f\n", MbitPerSecond(sent, time.Since(start)))
}

// MbitPerSecond is the rate of sending bytes in elapsed.
func MbitPerSecond(bytes int64, elapsed time.Duration) float64 {
	return float64(bytes) * 8 / 1e6 / elapsed.Seconds()
}

func rtt(hostport, count string) {
	n, err := strconv.Atoi(count)
	if err != nil || n < 1 {
		fail("COUNT is a positive integer")
	}
	// One connection for every request: the round trip, not the handshake.
	client := http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	samples := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		start := time.Now()
		resp, err := client.Get("http://" + hostport + "/")
		if err != nil {
			fail(err.Error())
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		samples = append(samples, time.Since(start))
	}
	min, median, max := Summary(samples)
	fmt.Printf("rtt_us min=%d median=%d max=%d\n", min.Microseconds(), median.Microseconds(), max.Microseconds())
}

// Summary is the minimum, median and maximum of samples (not empty); it sorts them.
func Summary(samples []time.Duration) (min, median, max time.Duration) {
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	return samples[0], samples[len(samples)/2], samples[len(samples)-1]
}
