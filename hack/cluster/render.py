"""What each node's daemons read: containerd's config, the CNI template, kubelet's config, kubeconfigs.

Pure functions of a Node's facts, so they are unit-tested (test_render.py) without a machine.
"""

import json


def containerd_config(s, pause_image):
    """containerd 1.6 for the node whose state dir is s (see the table in cluster.py's header)."""
    return f"""version = 2
root = "{s}/containerd/root"
state = "{s}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{s}/containerd/containerd.sock"

[ttrpc]
  address = "{s}/containerd/ttrpc.sock"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{s}/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image}"
  # Without it every sandbox fails ("can't get final child's PID from pipe"): root here lacks
  # CAP_SYS_RESOURCE to lower oom_score_adj.
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  # Pod network namespaces under this node's state dir, not /var/run/netns shared by every node.
  netns_mounts_under_state_dir = true

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "{s}/containerd/runc"

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "{s}/cni/bin"
  conf_dir = "{s}/cni/net.d"
  max_conf_num = 1
  # CNI=bridge: rendered by containerd from the Node's pod CIDRs once kubelet reports them (kubenet's old
  # job); until then there is no CNI config and the Node stays NotReady.
  conf_template = "{s}/cni/template.json"
"""


def cni_template(name, s):
    """bridge + host-local over every pod CIDR of the Node (both families), as a Go text/template that
    containerd fills with .PodCIDRRanges and .Routes (a default route per family)."""
    ranges = '{{range $i, $r := .PodCIDRRanges}}{{if $i}}, {{end}}[{"subnet": "{{$r}}"}]{{end}}'
    routes = '{{range $i, $r := .Routes}}{{if $i}}, {{end}}{"dst": "{{$r}}"}{{end}}'
    return f"""{{
  "cniVersion": "0.4.0",
  "name": "{name}",
  "plugins": [
    {{
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {{
        "type": "host-local",
        "dataDir": "{s}/cni/ipam",
        "ranges": [{ranges}],
        "routes": [{routes}]
      }}
    }},
    {{"type": "portmap", "capabilities": {{"portMappings": true}}, "snat": false}}
  ]
}}
"""


def kubelet_config(node, s, ca):
    """KubeletConfiguration of one node, with what must differ per node on one machine."""
    return f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
# Mandatory per node: a kubelet kills every pod cgroup under <cgroupRoot>/kubepods it does not know.
cgroupRoot: /{node.name}
cgroupsPerQOS: true
containerRuntimeEndpoint: unix://{s}/containerd/containerd.sock
failSwapOn: false
address: {node.ipv4}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: {s}/pki/kubelet-serving.crt
tlsPrivateKeyFile: {s}/pki/kubelet-serving.key
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {ca}}}
authorization:
  mode: Webhook
# Per node: container GC deletes every pod log dir of a pod it does not know.
podLogsDir: {s}/pod-logs
volumePluginDir: {s}/volume-plugins
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "100Mi"
  nodefs.inodesFree: "1%"
  imagefs.available: "100Mi"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
maxPods: 30
serializeImagePulls: false
"""


def kubeconfig(server, ca, cert, key, user):
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "netcm-cluster", "cluster": {"server": server, "certificate-authority": ca}}],
            "users": [{"name": user, "user": {"client-certificate": cert, "client-key": key}}],
            "contexts": [{"name": "netcm-cluster", "context": {"cluster": "netcm-cluster", "user": user}}],
            "current-context": "netcm-cluster",
        },
        indent=2,
    )
