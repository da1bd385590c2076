"""What the control plane writes and runs, checked without starting it:
python3 -m unittest discover -s hack/controlplane"""

import os
import socket
import subprocess
import sys
import tempfile
import unittest

import render

HERE = os.path.dirname(os.path.abspath(__file__))


def flag(args, name):
    """The value after flag name in a command line."""
    return args[args.index(name) + 1]


class ApiserverArgsTest(unittest.TestCase):
    def args(self, node_mode, extra=()):
        return render.apiserver_args("/s", 2379, 6443, "/s/audit.log", node_mode, "192.0.2.2", "10.96.0.0/24", extra)

    def test_a_test_apiserver_serves_on_loopback_with_rbac_alone_and_no_serviceaccount_admission(self):
        args = self.args("0")
        self.assertEqual(flag(args, "--bind-address"), "127.0.0.1")
        self.assertEqual(flag(args, "--authorization-mode"), "RBAC")
        self.assertEqual(flag(args, "--disable-admission-plugins"), "ServiceAccount")
        self.assertNotIn("--kubelet-client-certificate", args)

    def test_a_node_apiserver_serves_on_the_node_address_with_node_authorization_and_node_restriction(self):
        args = self.args("1")
        self.assertEqual(flag(args, "--bind-address"), "192.0.2.2")
        self.assertEqual(flag(args, "--advertise-address"), "192.0.2.2")
        self.assertEqual(flag(args, "--authorization-mode"), "Node,RBAC")
        self.assertEqual(flag(args, "--enable-admission-plugins"), "NodeRestriction")
        self.assertEqual(flag(args, "--kubelet-client-certificate"), "/s/pki/kubelet-client.crt")
        self.assertNotIn("--disable-admission-plugins", args)

    def test_both_servers_share_etcd_and_keys_but_not_port_or_audit_log_and_extra_flags_come_last(self):
        args = render.apiserver_args("/s", 2379, 7443, "/s/audit2.log", "0", "127.0.0.1", "10.0.0.0/24",
                                     ["--feature-gates=WatchList=false"])
        self.assertEqual(flag(args, "--etcd-servers"), "http://127.0.0.1:2379")
        self.assertEqual(flag(args, "--secure-port"), "7443")
        self.assertEqual(flag(args, "--audit-log-path"), "/s/audit2.log")
        self.assertEqual(flag(args, "--service-account-signing-key-file"), "/s/pki/sa.key")
        self.assertEqual(args[-1], "--feature-gates=WatchList=false")

    def test_the_command_line_prints_one_argument_a_line_as_the_script_reads_it(self):
        out = subprocess.run(
            [sys.executable, os.path.join(HERE, "render.py"), "apiserver-args", "/s", "2379", "6443", "/s/audit.log",
             "1", "192.0.2.2", "10.96.0.0/24", "--v=2", "--feature-gates=A=true,B=false"],
            check=True, capture_output=True, text=True,
        ).stdout
        self.assertEqual(out.splitlines(), self.args("1", ["--v=2", "--feature-gates=A=true,B=false"]))


class EtcdArgsTest(unittest.TestCase):
    def test_etcd_is_one_member_on_loopback_with_its_data_in_the_state_dir(self):
        args = render.etcd_args("/s", 2379, 2380, 2381)
        self.assertEqual(flag(args, "--data-dir"), "/s/etcd-data")
        self.assertEqual(flag(args, "--listen-client-urls"), "http://127.0.0.1:2379")
        self.assertEqual(flag(args, "--initial-cluster"), "netcm-test=http://127.0.0.1:2380")
        self.assertEqual(flag(args, "--listen-metrics-urls"), "http://127.0.0.1:2381")


class FilesTest(unittest.TestCase):
    def test_the_service_ip_is_the_first_address_of_the_service_range_in_either_family(self):
        self.assertEqual(render.service_ip("10.96.0.0/24"), "10.96.0.1")
        self.assertEqual(render.service_ip("fd00:10::/108"), "fd00:10::1")

    def test_the_serving_certificate_names_the_service_and_a_node_address_only_outside_loopback(self):
        loopback = render.serving_ext("127.0.0.1", "10.0.0.0/24")
        self.assertIn("IP:10.0.0.1,", loopback)
        self.assertIn("DNS:kubernetes.default.svc.cluster.local\n", loopback)
        self.assertEqual(loopback.count("IP:127.0.0.1"), 1)
        node = render.serving_ext("192.0.2.2", "10.96.0.0/24")
        self.assertTrue(node.startswith("subjectAltName=IP:127.0.0.1,"))
        self.assertIn(",IP:192.0.2.2\nextendedKeyUsage=serverAuth\n", node)

    def test_the_kubeconfig_names_the_server_and_the_admin_credentials(self):
        conf = render.kubeconfig("192.0.2.2", 6443, "/s/pki")
        self.assertIn("      server: https://192.0.2.2:6443\n", conf)
        self.assertIn("      certificate-authority: /s/pki/ca.crt\n", conf)
        self.assertIn("      client-key: /s/pki/admin.key\n", conf)

    def test_the_state_file_reads_back_in_bash_with_the_mode_a_caller_asked_for(self):
        env = dict(os.environ, NETCM_NODE_MODE="1", NETCM_API_HOST="192.0.2.2", NETCM_SERVICE_CIDR="")
        out = subprocess.run([sys.executable, os.path.join(HERE, "render.py"), "env", "1", "2", "3", "4"],
                             env=env, check=True, capture_output=True, text=True).stdout
        with tempfile.NamedTemporaryFile("w", suffix=".env") as f:
            f.write(out)
            f.flush()
            got = subprocess.run(
                ["bash", "-c", 'source "$1"; echo "$ETCD_METRICS_PORT $APISERVER_PORT $NODE_MODE $API_HOST $SERVICE_CIDR"',
                 "-", f.name], check=True, capture_output=True, text=True).stdout
        # An empty NETCM_SERVICE_CIDR takes the default, as bash's ${VAR:-default} did.
        self.assertEqual(got, "3 4 1 192.0.2.2 10.0.0.0/24\n")

    def test_ports_are_chosen_distinct_and_never_one_already_taken(self):
        self.assertEqual(render.choose_ports(3, ["1"], iter([5, 1, 5, 2, 3, 4])), ["5", "2", "3"])

    def test_free_ports_can_be_bound_on_loopback(self):
        ports = render.free_ports(4)
        self.assertEqual(len(set(ports)), 4)
        for p in ports:
            with socket.socket() as s:
                s.bind(("127.0.0.1", int(p)))


if __name__ == "__main__":
    unittest.main()
