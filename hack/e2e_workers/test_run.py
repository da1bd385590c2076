"""Tests of run.py's pure parts: the test list, the skips, the order, the summary."""

import os
import tempfile
import threading
import time
import unittest

import run


class ParseList(unittest.TestCase):
    def test_only_tests_are_listed_not_benches_or_the_count(self):
        out = "a::one: test\nb::two: test\nb::bench: bench\n\n2 tests, 1 benchmark\n"
        self.assertEqual(run.parse_list(out), ["a::one", "b::two"])


class Selected(unittest.TestCase):
    def test_a_skip_drops_every_test_whose_name_contains_it_as_libtest_does(self):
        names = ["pod_network::x", "pod_network_flannel::y", "manager::z"]
        self.assertEqual(run.selected(names, ["pod_network::", "pod_network_flannel::"]), ["manager::z"])


class SkipCounts(unittest.TestCase):
    def test_each_skip_counts_the_tests_it_drops_and_a_stale_one_counts_none(self):
        names = ["pod_network::x", "pod_network_flannel::y", "manager::z"]
        self.assertEqual(run.skip_counts(names, ["pod_network::", "gone::"]), {"pod_network::": 1, "gone::": 0})


class Ordered(unittest.TestCase):
    def test_several_workers_take_untimed_tests_first_then_the_longest(self):
        got = run.ordered(["a", "b", "c", "d"], {"a": 5.0, "b": 50.0, "d": 20.0}, 2)
        self.assertEqual(got, ["c", "b", "d", "a"])

    def test_several_workers_take_the_tests_that_run_alone_last_by_name(self):
        got = run.ordered(["a", "s::x", "b", "s::w"], {"a": 5.0, "b": 50.0, "s::x": 90.0}, 2, ["s::"])
        self.assertEqual(got, ["b", "a", "s::w", "s::x"])

    def test_one_worker_runs_the_tests_by_name_as_cargo_test_does(self):
        got = run.ordered(["b", "d", "a", "c"], {"a": 5.0, "b": 50.0, "d": 20.0}, 1)
        self.assertEqual(got, ["a", "b", "c", "d"])


def wait_until(predicate, seconds=5.0):
    """Whether `predicate` turned true within `seconds`."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class GateOrder(unittest.TestCase):
    def test_a_test_alone_waits_for_the_running_ones_and_none_starts_beside_it(self):
        gate, started = run.Gate(), []
        release_alone = threading.Event()

        def alone():
            gate.enter(True)
            started.append("alone")
            release_alone.wait(5)
            gate.leave(True)

        def shared():
            gate.enter(False)
            started.append("shared-2")
            gate.leave(False)

        gate.enter(False)  # shared-1 runs
        first = threading.Thread(target=alone, daemon=True)
        first.start()
        self.assertTrue(wait_until(lambda: gate._alone), "the alone test announced itself")
        later = threading.Thread(target=shared, daemon=True)
        later.start()
        time.sleep(0.1)
        self.assertEqual(started, [], "nothing starts beside shared-1 once a test waits to run alone")
        gate.leave(False)
        self.assertTrue(wait_until(lambda: started == ["alone"]), started)
        time.sleep(0.1)
        self.assertEqual(started, ["alone"], "nothing starts beside the alone test")
        release_alone.set()
        first.join()
        later.join()
        self.assertEqual(started, ["alone", "shared-2"])

    def test_shared_tests_run_beside_each_other(self):
        gate = run.Gate()
        gate.enter(False)
        entered = threading.Event()
        t = threading.Thread(target=lambda: (gate.enter(False), entered.set()))
        t.start()
        self.assertTrue(entered.wait(1.0))
        t.join()


class Summary(unittest.TestCase):
    def test_the_closing_line_is_the_plain_count_ci_reads(self):
        self.assertEqual(run.summary_line(120, 3), "120 passed, 3 failed")

    def test_the_slowest_come_first(self):
        results = [{"name": "a", "seconds": 1.0, "worker": 1}, {"name": "b", "seconds": 9.5, "worker": 2}]
        self.assertEqual(run.slowest(results, 1), ["    9.5s  w2  b"])


class Durations(unittest.TestCase):
    def test_durations_of_passed_tests_are_kept_for_the_next_run_and_a_bad_file_is_ignored(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "sub", "durations.json")
            self.assertEqual(run.load_durations(path), {})
            run.save_durations(path, {"old": 3.0}, [
                {"name": "a", "ok": True, "seconds": 12.34},
                {"name": "b", "ok": False, "seconds": 99.0},
            ])
            self.assertEqual(run.load_durations(path), {"old": 3.0, "a": 12.3})
            with open(path, "w") as f:
                f.write("[not a map")
            self.assertEqual(run.load_durations(path), {})


if __name__ == "__main__":
    unittest.main()
