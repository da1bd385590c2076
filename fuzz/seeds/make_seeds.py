#!/usr/bin/env python3
"""Writes the starting corpus of each fuzz target from the fixtures the unit and e2e tests already use
(pkg/protobuf/testdata, e2e/testdata/node-ipam-controller) and a few flag values. Run from the repo
root; libFuzzer grows fuzz/corpus/<target>/ from here."""
import hashlib, json, os, sys
import yaml

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pb = os.path.join(root, "pkg/protobuf/testdata")
out = os.path.join(root, "fuzz/corpus")

def put(target, data):
    if isinstance(data, str):
        data = data.encode()
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + hashlib.sha1(data).hexdigest()[:16]), "wb") as f:
        f.write(data)

def read(name):
    with open(os.path.join(pb, name), "rb") as f:
        return f.read()

def varint(b, i):
    v = s = 0
    while True:
        c = b[i]; i += 1
        v |= (c & 0x7f) << s; s += 7
        if c < 0x80:
            return v, i

def fields(b):
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(b, i)
        elif wt == 2:
            n, i = varint(b, i); v = b[i:i + n]; i += n
        elif wt == 1:
            v = b[i:i + 8]; i += 8
        elif wt == 5:
            v = b[i:i + 4]; i += 4
        yield num, v

def raw_object(body):
    """The object bytes inside the k8s\\0 envelope (runtime.Unknown field 2)."""
    return dict(fields(body[4:]))[2]

for name in ["kubelet-node.pb", "list-page.pb", "node-deleting.pb", "status-404.pb"]:
    put("protobuf_object", read(name))
for name in ["kubelet-node.pb", "node-deleting.pb"]:
    put("protobuf_node", raw_object(read(name)))
for item_num, item in fields(raw_object(read("list-page.pb"))):
    if item_num == 2:
        put("protobuf_node", item)
for seed, name in enumerate(["watch.pb", "watch-gone.pb"]):
    put("watch_frames", bytes([seed]) + read(name))
    put("watch_frames", bytes([seed + 7]) + read(name))

for name in ["kubelet-node.json", "node-deleting.json"]:
    put("node_json", json.dumps(json.loads(read(name)), separators=(",", ":")))
for item in json.loads(read("list-page.json"))["items"]:
    put("node_json", json.dumps(item, separators=(",", ":")))

ipam = os.path.join(root, "e2e/testdata/node-ipam-controller")
specs = []
for f in sorted(x for x in os.listdir(ipam) if x.endswith(".yaml")):
    with open(os.path.join(ipam, f)) as fh:
        for doc in yaml.safe_load_all(fh):
            if doc and doc.get("kind") == "ClusterCIDR":
                specs.append(doc["spec"])
for s in specs:
    put("cluster_cidr", json.dumps(s, separators=(",", ":")))
put("cluster_cidr", json.dumps(specs, separators=(",", ":")))

for d in ["15s", "2m", "500ms", "1h30m", "1.5s", "0", "0s", "2us", "3µs", "4μs", "10ns", ".5h", "1.h", "+7m"]:
    put("duration", d)
for p in ["flannel.alpha.coreos.com", "example.com/net", "example.com/", "example.com/lease-", "a.b/c/d",
          "my_domain.example.com", "Example.com"]:
    put("annotation_prefix", p)
put("effective_configuration", json.dumps({
    "identity": "host_1", "version": "0.1.0",
    "controllers": ["subnet-allocator", "node-annotation-syncer", "route-controller"],
    "flags": {"--cluster-cidr": "10.244.0.0/16,fd00:10:244::/56", "--node-cidr-mask-size-ipv4": "24",
              "--node-cidr-mask-size-ipv6": "64", "--service-cluster-ip-range": "10.96.0.0/12",
              "--annotation-prefix": "flannel.alpha.coreos.com", "--backend-type": "host-gw",
              "--public-ip-address-types": "InternalIP,ExternalIP", "--allocate-node-cidrs": "true"}}))
