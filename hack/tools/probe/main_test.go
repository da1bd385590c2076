package main

import (
	"testing"
	"time"
)

func TestMbitPerSecond(t *testing.T) {
	if got := MbitPerSecond(125_000_000, 2*time.Second); got != 500 {
		t.Fatalf("125 MB in 2 s = %v Mbit/s, want 500", got)
	}
}

func TestSummarySortsAndPicksTheMiddle(t *testing.T) {
	min, median, max := Summary([]time.Duration{5, 1, 3, 9, 7})
	if min != 1 || median != 5 || max != 9 {
		t.Fatalf("got %v %v %v, want 1 5 9", min, median, max)
	}
}

func TestChecksumOfAnEchoRequest(t *testing.T) {
	// An ICMPv4 echo request, id 1 seq 1, no payload: the checksum is the complement of 0x0802.
	msg := []byte{8, 0, 0, 0, 0, 1, 0, 1}
	if got := checksum(msg); got != 0xf7fd {
		t.Fatalf("checksum %#x, want 0xf7fd", got)
	}
}
