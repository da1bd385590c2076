"""Tests of fresh_machine.py's pure parts: the step table it reads and the environment it makes."""

import os
import tempfile
import unittest

import fresh_machine


class ParseStepTimes(unittest.TestCase):
    def test_the_last_times_table_of_a_run_is_read_with_every_step(self):
        out = "\n".join([
            "=== prerequisites", "noise", "=== times (total 99s)", "   10s  old run",
            "", "=== times (total 1234s)", "  512s  prerequisites", "   30s  cargo fmt --check", "trailing",
        ])
        self.assertEqual(fresh_machine.parse_step_times(out),
                         (1234, [(512, "prerequisites"), (30, "cargo fmt --check")]))

    def test_a_run_that_printed_no_table_gives_none(self):
        self.assertEqual(fresh_machine.parse_step_times("=== prerequisites\nerror"), (None, []))


class FreshEnv(unittest.TestCase):
    def test_every_cache_is_under_the_scratch_directory_and_no_override_is_inherited(self):
        base = {"PATH": "/usr/bin", "NETCM_BIN": "/x/netcm", "CARGO_TARGET_DIR": "/t", "HOME": "/root"}
        env = fresh_machine.fresh_env("/s", base)
        for var in ("NETCM_CACHE_DIR", "GOCACHE", "GOMODCACHE", "CARGO_HOME", "CARGO_INSTALL_ROOT"):
            self.assertTrue(env[var].startswith("/s/"), var)
        self.assertNotIn("NETCM_BIN", env)
        self.assertNotIn("CARGO_TARGET_DIR", env)
        self.assertEqual(env["PATH"].split(os.pathsep)[0], "/s/cargo-tools/bin")
        self.assertEqual(base["NETCM_BIN"], "/x/netcm", "the caller's environment is not changed")


class ForgetTheControlPlane(unittest.TestCase):
    def test_the_next_run_finds_no_state_of_the_control_plane_before_it(self):
        with tempfile.TemporaryDirectory() as checkout:
            etcd = os.path.join(checkout, "_out", "controlplane", "etcd-data", "member")
            os.makedirs(etcd)
            calls = []
            fresh_machine.forget_the_control_plane(checkout, {}, run=lambda args, **kw: calls.append(args))
            self.assertEqual(calls, [["bash", "hack/controlplane.sh", "down"]])
            self.assertFalse(os.path.exists(os.path.join(checkout, "_out", "controlplane")))
            self.assertTrue(os.path.isdir(os.path.join(checkout, "_out")))


class FormatTable(unittest.TestCase):
    def test_times_show_as_minutes_and_seconds_and_a_missing_one_as_a_dash(self):
        table = fresh_machine.format_table([("a", 125, "ok"), ("longer name", None, "see log")])
        lines = table.splitlines()
        self.assertIn("2m05s", lines[1])
        self.assertRegex(lines[2], r"longer name\s+-  see log")


if __name__ == "__main__":
    unittest.main()
