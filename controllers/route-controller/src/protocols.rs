//! Route protocol numbers that other software marks its routes with. netcm lists, replaces and deletes
//! every route in its table that carries its `--route-protocol`, so sharing a number with anyone else
//! would make netcm delete their routes (with 16, the host's DHCP default route).

/// A protocol number someone else uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TakenProtocol {
    /// The number.
    pub number: u8,
    /// Its name where it is defined.
    pub name: &'static str,
    /// Whose routes carry it, and where that is written down.
    pub used_by: &'static str,
}

const fn taken(number: u8, name: &'static str, used_by: &'static str) -> TakenProtocol {
    TakenProtocol {
        number,
        name,
        used_by,
    }
}

/// Every number defined by linux/rtnetlink.h (`RTPROT_*`), iproute2's `rt_protos`, FRR's
/// zebra/rt_netlink.h, plus Calico Felix's 80. 0–4 are interpreted by the kernel itself.
pub const TAKEN: &[TakenProtocol] = &[
    taken(0, "unspec", "the kernel (linux/rtnetlink.h)"),
    taken(
        1,
        "redirect",
        "the kernel, for ICMP redirects (linux/rtnetlink.h)",
    ),
    taken(2, "kernel", "the kernel (linux/rtnetlink.h)"),
    taken(
        3,
        "boot",
        "boot-time configuration and flannel (linux/rtnetlink.h)",
    ),
    taken(
        4,
        "static",
        "administrators and network managers (linux/rtnetlink.h)",
    ),
    taken(8, "gated", "GateD (iproute2 rt_protos)"),
    taken(9, "ra", "router advertisements (iproute2 rt_protos)"),
    taken(10, "mrt", "Merit MRT (iproute2 rt_protos)"),
    taken(11, "zebra", "Zebra and FRR (iproute2 rt_protos)"),
    taken(12, "bird", "BIRD, also under Calico (iproute2 rt_protos)"),
    taken(
        13,
        "dnrouted",
        "the DECnet routing daemon (iproute2 rt_protos)",
    ),
    taken(14, "xorp", "XORP (iproute2 rt_protos)"),
    taken(15, "ntk", "Netsukuku (iproute2 rt_protos)"),
    taken(16, "dhcp", "DHCP clients (iproute2 rt_protos)"),
    taken(
        17,
        "mrouted",
        "the multicast routing daemon (linux/rtnetlink.h)",
    ),
    taken(18, "keepalived", "keepalived (iproute2 rt_protos)"),
    taken(42, "babel", "babeld (iproute2 rt_protos)"),
    taken(80, "felix", "Calico Felix"),
    taken(99, "openr", "Open/R (iproute2 rt_protos)"),
    taken(186, "bgp", "FRR bgpd (iproute2 rt_protos)"),
    taken(187, "isis", "FRR isisd (iproute2 rt_protos)"),
    taken(188, "ospf", "FRR ospfd (iproute2 rt_protos)"),
    taken(189, "rip", "FRR ripd (iproute2 rt_protos)"),
    taken(190, "ripng", "FRR ripngd (FRR zebra/rt_netlink.h)"),
    taken(191, "nhrp", "FRR nhrpd (FRR zebra/rt_netlink.h)"),
    taken(192, "eigrp", "FRR eigrpd (iproute2 rt_protos)"),
    taken(193, "ldp", "FRR ldpd (FRR zebra/rt_netlink.h)"),
    taken(194, "sharp", "FRR sharpd (FRR zebra/rt_netlink.h)"),
    taken(195, "pbr", "FRR pbrd (FRR zebra/rt_netlink.h)"),
    taken(196, "zstatic", "FRR staticd (FRR zebra/rt_netlink.h)"),
    taken(197, "openfabric", "FRR fabricd (FRR zebra/rt_netlink.h)"),
    taken(198, "srte", "FRR pathd (FRR zebra/rt_netlink.h)"),
];

/// Who else uses `number`, if anyone.
pub fn taken_by(number: u8) -> Option<&'static TakenProtocol> {
    TAKEN.iter().find(|t| t.number == number)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// iproute2 6.1's /etc/iproute2/rt_protos, as shipped.
    const RT_PROTOS: &str = "0 unspec\n1 redirect\n2 kernel\n3 boot\n4 static\n8 gated\n9 ra\n10 mrt\n\
        11 zebra\n12 bird\n13 dnrouted\n14 xorp\n15 ntk\n16 dhcp\n18 keepalived\n42 babel\n99 openr\n\
        186 bgp\n187 isis\n188 ospf\n189 rip\n192 eigrp\n";

    #[test]
    fn every_number_iproute2_names_is_taken_under_that_name() {
        for line in RT_PROTOS.lines() {
            let (number, name) = line.split_once(' ').expect("number name");
            let number: u8 = number.parse().expect("number");
            assert_eq!(taken_by(number).map(|t| t.name), Some(name), "{line}");
        }
    }

    #[test]
    fn the_kernels_and_frrs_own_numbers_are_taken_and_netcms_default_is_free() {
        for n in [
            0, 1, 2, 3, 4, 17, 80, 190, 191, 193, 194, 195, 196, 197, 198,
        ] {
            assert!(taken_by(n).is_some(), "{n}");
        }
        for n in [5, 6, 7, 19, 100, 199, 200, 255] {
            assert_eq!(taken_by(n), None, "{n}");
        }
    }

    #[test]
    fn the_list_has_each_number_once_in_order() {
        assert!(TAKEN.windows(2).all(|w| w[0].number < w[1].number));
    }
}
