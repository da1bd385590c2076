//! `MODE=scale`: rounds of one backlog's rows, each row on a fresh Node set — the ceilings, another netcm
//! build (NETCM_BIN_BEFORE), netcm, the bare ceiling and the floor again (BARE_AFTER, FLOOR_AFTER),
//! kube-controller-manager — then the median of each round's ratios. A ceiling run on both sides of
//! netcm brackets it: netcm over their mean is free of a drift that is steady over the three rows.
//!
//! With ROTATE=1 round r starts at its r-th row and wraps around, so no row always runs first or last in
//! a round: on this machine the same bare ceiling took 22.6 and 39.9 s 25 minutes apart
//! (docs/performance.md), a drift a fixed order hands to whichever row comes later. The rows are printed
//! in their usual order whatever order they ran in. With RESTART_APISERVER=1 every row starts on a new
//! kube-apiserver process instead of one that has served the rows before it (its heap 5 GiB after a few
//! rounds of 20,000 Nodes).

use std::path::PathBuf;

use crate::ceiling::{api_ceiling, CeilingLoad, CeilingPatch, AFTER_NETCM_SUFFIX};
use crate::contenders::{kcm, netcm_from, run_backlog, Row};
use crate::fixtures::fresh_apiserver;
use crate::{ceiling_rows, compare, flag, print_table, summary, Config};

/// One row of a round.
enum Slot {
    Ceiling(CeilingLoad, CeilingPatch),
    /// Another netcm build, to measure a change in one run.
    NetcmBefore(PathBuf),
    Netcm,
    /// A ceiling run again after netcm (the bare one, the floor), to bracket it.
    CeilingAfterNetcm(CeilingLoad, CeilingPatch),
    Kcm,
}

/// A round's rows in the order they are printed (and, without ROTATE, run).
fn slots(cfg: &Config) -> Vec<Slot> {
    let mut slots: Vec<Slot> = ceiling_rows(cfg)
        .into_iter()
        .map(|(load, patch)| Slot::Ceiling(load, patch))
        .collect();
    if let Ok(before) = std::env::var("NETCM_BIN_BEFORE") {
        slots.push(Slot::NetcmBefore(PathBuf::from(before)));
    }
    slots.push(Slot::Netcm);
    // The bare ceiling on both sides of netcm: the mean of the two takes a steady drift out of the ratio.
    if flag("BARE_AFTER") {
        slots.push(Slot::CeilingAfterNetcm(
            CeilingLoad::Bare,
            CeilingPatch::Strategic,
        ));
    }
    // The same floor differs by up to 19 % within a round, so netcm is compared with the mean of a floor
    // on each side.
    if flag("ALLOCATOR_FLOOR") && flag("FLOOR_AFTER") {
        slots.push(Slot::CeilingAfterNetcm(
            CeilingLoad::AllocatorFloor,
            CeilingPatch::JsonAsNetcm,
        ));
    }
    if !flag("ONLY_NETCM") {
        slots.push(Slot::Kcm);
    }
    slots
}

/// The order round `round` (from 1) runs `n` rows in: as printed, or rotated to start at row
/// `round - 1` (wrapping) when `rotate`.
fn run_order(n: usize, round: usize, rotate: bool) -> Vec<usize> {
    let first = if rotate && n > 0 { (round - 1) % n } else { 0 };
    (0..n).map(|i| (first + i) % n).collect()
}

async fn run_slot(client: &kube::Client, cfg: &Config, slot: &Slot, fair: &[&str]) -> Row {
    let (qps, burst) = (cfg.qps, cfg.burst);
    match slot {
        Slot::Ceiling(load, patch) => api_ceiling(client, cfg, *load, *patch).await,
        Slot::NetcmBefore(bin) => {
            let label = format!("netcm before (qps {qps}, burst {burst})");
            let before = netcm_from(bin, cfg, &label, &cfg.netcm_controllers, fair);
            run_backlog(client, cfg, before).await
        }
        Slot::Netcm => {
            let label = format!("netcm (qps {qps}, burst {burst})");
            let bin = netcm_e2e::netcm::netcm_binary();
            let netcm = netcm_from(bin, cfg, &label, &cfg.netcm_controllers, fair);
            run_backlog(client, cfg, netcm).await
        }
        Slot::CeilingAfterNetcm(load, patch) => {
            let mut after = api_ceiling(client, cfg, *load, *patch).await;
            after.contender.push_str(AFTER_NETCM_SUFFIX);
            after
        }
        Slot::Kcm => {
            // At KCM's default qps 20, 50,000 Nodes would take 40 minutes: only the equal-QPS pair runs.
            let label = format!("kube-controller-manager nodeipam (qps {qps}, burst {burst})");
            run_backlog(client, cfg, kcm(cfg, &label, qps, burst)).await
        }
    }
}

/// `MODE=scale`.
pub async fn scale_mode(client: &kube::Client, cfg: &Config) {
    let fair = [
        format!("--kube-api-qps={}", cfg.qps),
        format!("--kube-api-burst={}", cfg.burst),
    ];
    let fair: Vec<&str> = fair.iter().map(String::as_str).collect();
    let slots = slots(cfg);
    let rotate = flag("ROTATE");
    let mut rounds = Vec::new();
    for round in 1..=cfg.rounds {
        let order = run_order(slots.len(), round, rotate);
        if cfg.rounds > 1 {
            eprintln!(
                "[bench] round {round} of {} (rows run in the order {order:?})",
                cfg.rounds
            );
        }
        let mut ran: Vec<(usize, Row)> = Vec::with_capacity(slots.len());
        for &i in &order {
            fresh_apiserver(client).await;
            ran.push((i, run_slot(client, cfg, &slots[i], &fair).await));
        }
        ran.sort_by_key(|(i, _)| *i);
        let rows: Vec<Row> = ran.into_iter().map(|(_, row)| row).collect();
        if cfg.rounds > 1 {
            println!("\nRound {round} of {}:", cfg.rounds);
        }
        print_table(cfg, &rows);
        compare(&rows, "netcm (", "kube-controller-manager");
        rounds.push(rows);
    }
    if cfg.rounds > 1 {
        summary::print_medians(&rounds, "netcm (", "kube-controller-manager");
    }
}

#[cfg(test)]
mod tests {
    use super::run_order;

    #[test]
    fn without_rotation_every_round_runs_the_rows_in_their_printed_order() {
        for round in 1..=4 {
            assert_eq!(run_order(4, round, false), vec![0, 1, 2, 3]);
        }
    }

    #[test]
    fn rotated_each_round_starts_one_row_later_and_every_row_runs_once() {
        assert_eq!(run_order(3, 1, true), vec![0, 1, 2]);
        assert_eq!(run_order(3, 2, true), vec![1, 2, 0]);
        assert_eq!(run_order(3, 3, true), vec![2, 0, 1]);
        assert_eq!(run_order(3, 4, true), vec![0, 1, 2]);
        assert!(run_order(0, 2, true).is_empty());
    }
}
