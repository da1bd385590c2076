"""What `down` leaves of a node's and the cluster's state dir, and what add-node reads from it, checked on a
scratch directory: python3 -m unittest discover -s hack/cluster"""

import os
import tempfile
import unittest

import cluster

# What `up` and the node's pods write under a node's directory, bridge and flannel runs together.
NODE_FILES = ["kubelet.log", "containerd.log", "kube-proxy.log", "kubelet.pid", "kubelet.kubeconfig",
              "kubelet-config.yaml", "pki/kubelet.crt", "containerd/config.toml", "cni/template.json",
              "cni/net.d/10-flannel.conflist", "cni/ipam/pods/last_reserved_ip.0", "cni/flannel/abc",
              "flannel/subnet.env", "pod-logs/default_probe/probe/0.log", "volume-plugins/x", "kubelet/pods/p"]


def write(root, rel):
    os.makedirs(os.path.dirname(f"{root}/{rel}"), exist_ok=True)
    with open(f"{root}/{rel}", "w") as f:
        f.write("x")


def tree(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


class DownTest(unittest.TestCase):
    def test_a_cleared_node_directory_keeps_only_its_logs(self):
        with tempfile.TemporaryDirectory() as s:
            for rel in NODE_FILES:
                write(s, rel)
            os.makedirs(f"{s}/cni/bin")
            os.symlink("/usr/lib/cni/bridge", f"{s}/cni/bin/bridge")
            os.symlink(f"{s}/cni", f"{s}/link-to-a-dir")
            cluster.clear_node_dir(s)
            self.assertEqual(tree(s), ["containerd.log", "kube-proxy.log", "kubelet.log"])
            self.assertEqual(sorted(os.listdir(s)), ["containerd.log", "kube-proxy.log", "kubelet.log"])

    def test_a_cleared_state_dir_keeps_logs_the_control_plane_and_the_image_cache(self):
        with tempfile.TemporaryDirectory() as state:
            for rel in ["nodes/ncm-n1/flannel/subnet.env", "nodes/ncm-n1/kubelet.log", "nodes/ncm-n7/cni/template.json",
                        "pki/kube-proxy.crt", "kube-proxy.kubeconfig", "kube-scheduler.kubeconfig", "images", "cni",
                        "credentials/hostile-1/kubelet.crt", "credentials/hostile-1/kubeconfig",
                        "kube-scheduler.log", "images.d/pause.tar", "controlplane/pki/ca.crt"]:
                write(state, rel)
            cluster.clear_state_dir(state)
            self.assertEqual(tree(state), ["controlplane/pki/ca.crt", "images.d/pause.tar", "kube-scheduler.log",
                                           "nodes/ncm-n1/kubelet.log"])

    def test_a_node_added_later_gets_the_cni_up_saved_whatever_its_caller_says(self):
        with tempfile.TemporaryDirectory() as state:
            self.assertEqual(cluster.cni_of(state, {}), "bridge")
            self.assertEqual(cluster.cni_of(state, {"CNI": "flannel"}), "flannel")
            with open(f"{state}/cni", "w") as f:
                f.write("flannel\n")
            self.assertEqual(cluster.cni_of(state, {}), "flannel")
            with self.assertRaises(SystemExit):
                cluster.cni_of(state, {"CNI": "bridge"})
            with self.assertRaises(SystemExit):
                cluster.cni_of(tempfile.gettempdir() + "/absent", {"CNI": "calico"})

    def test_clearing_what_is_not_there_is_no_error(self):
        with tempfile.TemporaryDirectory() as state:
            cluster.clear_node_dir(f"{state}/nodes/ncm-n1")
            cluster.clear_state_dir(f"{state}/absent")


if __name__ == "__main__":
    unittest.main()
