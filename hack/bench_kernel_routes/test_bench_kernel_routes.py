import unittest

from bench_kernel_routes import batch, destination, gateway


class BatchTest(unittest.TestCase):
    def test_every_route_has_its_own_destination_and_in_distinct_mode_its_own_gateway(self):
        lines = batch(70000 - 4465, "distinct")
        self.assertEqual(len(set(l.split()[2] for l in lines)), len(lines))
        self.assertEqual(len(set(l.split()[4] for l in lines)), len(lines))
        self.assertNotIn("via 172.16.0.1 ", "\n".join(lines), "the namespace's own address is no gateway")

    def test_shared_mode_routes_every_destination_via_one_gateway(self):
        lines = batch(300, "shared")
        self.assertEqual({l.split()[4] for l in lines}, {gateway(0)})

    def test_nexthop_mode_adds_one_nexthop_per_route_and_points_the_route_at_it(self):
        self.assertEqual(
            batch(2, "nexthop"),
            [
                "nexthop add id 1 via 172.16.0.2 dev d0 proto 199",
                "route add 10.0.0.0/24 nhid 1 table 100 proto 199",
                "nexthop add id 2 via 172.16.0.3 dev d0 proto 199",
                "route add 10.0.1.0/24 nhid 2 table 100 proto 199",
            ],
        )

    def test_gateways_cross_into_the_next_octet_and_destinations_stop_at_the_end_of_10_0_0_0_8(self):
        self.assertEqual(gateway(65534), "172.17.0.0")
        self.assertEqual(destination(65535), "10.255.255.0/24")
        with self.assertRaises(ValueError):
            destination(65536)


if __name__ == "__main__":
    unittest.main()
