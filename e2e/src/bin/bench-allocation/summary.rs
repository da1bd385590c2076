//! Several rounds of one mode, reduced to the ratios the targets are stated in. A single run on a shared
//! 2-core machine swings by ±25 %; the ratios of one round share its conditions, so their median across
//! rounds is what the README reports.

use crate::ceiling::{AFTER_NETCM_SUFFIX, FLOOR_LABEL};
use crate::contenders::Row;

/// The ratios of one round: netcm against the bare ceiling, the ceiling with watches, and KCM.
pub struct RoundRatios {
    netcm_seconds: f64,
    pub over_bare: f64,
    /// Against the bare ceiling run again after netcm (`BARE_AFTER=1`).
    pub over_bare_after: Option<f64>,
    /// Against the mean of the bare ceiling before and after netcm.
    pub over_bare_around: Option<f64>,
    pub over_watched: Option<f64>,
    over_json_patch: Option<f64>,
    /// Against what any allocator must do: the list and watch of every Node, netcm's PATCHes.
    pub over_floor: Option<f64>,
    /// Against the floor run again after netcm (`FLOOR_AFTER=1`).
    pub over_floor_after: Option<f64>,
    /// Against the mean of the floor before and after netcm: what the round's drift cannot move.
    pub over_floor_around: Option<f64>,
    /// Until the last lease, against the ceiling making both writes per Node.
    leased_over_two_writes: Option<f64>,
    over_kcm_time: Option<f64>,
    over_kcm_rss: Option<f64>,
    over_kcm_cpu: Option<f64>,
}

/// netcm's ratios in one round's `rows`, its row and KCM's found by label prefix; None without netcm's.
pub fn ratios(rows: &[Row], netcm_label: &str, kcm_label: &str) -> Option<RoundRatios> {
    let bare = rows.first()?;
    let by = |needle: &str| rows.iter().find(|r| r.contender.starts_with(needle));
    let n = by(netcm_label)?;
    let k = by(kcm_label);
    let watched = rows
        .iter()
        .find(|r| r.contender.contains("watch of every Node"));
    let stat_ratio = |f: fn(&crate::measure::ProcStats) -> f64| {
        let (a, b) = (n.stats?, k?.stats?);
        Some(f(&a) / f(&b))
    };
    let json_patch = rows
        .iter()
        .find(|r| r.contender.contains("JSON Patch as netcm's"));
    let floor = rows
        .iter()
        .find(|r| r.contender.contains(FLOOR_LABEL) && !r.contender.ends_with(AFTER_NETCM_SUFFIX));
    let floor_after = rows
        .iter()
        .find(|r| r.contender.contains(FLOOR_LABEL) && r.contender.ends_with(AFTER_NETCM_SUFFIX));
    let bare_again = format!("{}{AFTER_NETCM_SUFFIX}", bare.contender);
    let bare_after = rows.iter().find(|r| r.contender == bare_again);
    let two_writes = crate::ceiling::two_writes_seconds(rows);
    Some(RoundRatios {
        netcm_seconds: n.seconds,
        over_bare: n.seconds / bare.seconds,
        over_bare_after: bare_after.map(|a| n.seconds / a.seconds),
        over_bare_around: bare_after.map(|a| n.seconds / ((bare.seconds + a.seconds) / 2.0)),
        over_watched: watched.map(|w| n.seconds / w.seconds),
        over_json_patch: json_patch.map(|j| n.seconds / j.seconds),
        over_floor: floor.map(|f| n.seconds / f.seconds),
        over_floor_after: floor_after.map(|f| n.seconds / f.seconds),
        over_floor_around: floor
            .zip(floor_after)
            .map(|(b, a)| n.seconds / ((b.seconds + a.seconds) / 2.0)),
        leased_over_two_writes: n.leased_seconds.zip(two_writes).map(|(l, c)| l / c),
        over_kcm_time: k.map(|k| n.seconds / k.seconds),
        over_kcm_rss: stat_ratio(|s| s.peak_rss_mib),
        over_kcm_cpu: stat_ratio(|s| s.cpu_seconds),
    })
}

/// The median of `values` (the mean of the middle two for an even count); None when empty.
pub fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    })
}

/// Prints one line of ratios per round and their medians.
pub fn print_medians(rounds: &[Vec<Row>], netcm_label: &str, kcm_label: &str) {
    let all: Vec<RoundRatios> = rounds
        .iter()
        .filter_map(|rows| ratios(rows, netcm_label, kcm_label))
        .collect();
    let cell = |v: Option<f64>| v.map_or_else(|| "–".to_string(), |v| format!("{v:.2}"));
    println!(
        "\nnetcm's ratios per round ({} rounds; each against the rows of its own round)\n",
        all.len()
    );
    println!(
        "| round | netcm time | ÷ bare ceiling | ÷ the bare ceiling before and after (mean) | ÷ bare ceiling, JSON Patch as netcm's | ÷ ceiling with \
         watches | ÷ an allocator's floor | ÷ the floor before and after (mean) | last lease ÷ ceiling of two writes | time ÷ KCM | peak RSS ÷ KCM | \
         CPU ÷ KCM |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (i, r) in all.iter().enumerate() {
        println!(
            "| {} | {:.1} s | {:.2} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            i + 1,
            r.netcm_seconds,
            r.over_bare,
            cell(r.over_bare_around),
            cell(r.over_json_patch),
            cell(r.over_watched),
            cell(r.over_floor),
            cell(r.over_floor_around),
            cell(r.leased_over_two_writes),
            cell(r.over_kcm_time),
            cell(r.over_kcm_rss),
            cell(r.over_kcm_cpu),
        );
    }
    let med = |f: fn(&RoundRatios) -> Option<f64>| median(all.iter().filter_map(f).collect());
    println!(
        "| median | {} s | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        med(|r| Some(r.netcm_seconds)).map_or_else(|| "–".into(), |v| format!("{v:.1}")),
        cell(med(|r| Some(r.over_bare))),
        cell(med(|r| r.over_bare_around)),
        cell(med(|r| r.over_json_patch)),
        cell(med(|r| r.over_watched)),
        cell(med(|r| r.over_floor)),
        cell(med(|r| r.over_floor_around)),
        cell(med(|r| r.leased_over_two_writes)),
        cell(med(|r| r.over_kcm_time)),
        cell(med(|r| r.over_kcm_rss)),
        cell(med(|r| r.over_kcm_cpu)),
    );
}

#[cfg(test)]
mod tests {
    use super::{median, ratios};
    use crate::ceiling::{AFTER_NETCM_SUFFIX, FLOOR_LABEL};
    use crate::contenders::Row;

    fn row(contender: String, seconds: f64) -> Row {
        Row {
            contender,
            seconds,
            leased_seconds: None,
            writes: Default::default(),
            stats: None,
            idle_cpu_pct: None,
            apiserver_cpu_seconds: 0.0,
            apiserver_node_cache_checks: 0,
            stolen_cpu_pct: 0.0,
        }
    }

    /// A round's bare ceiling, floor and netcm rows taking `bare`, `floor` and `netcm` seconds.
    fn bare_floor_netcm(bare: f64, floor: f64, netcm: f64) -> Vec<Row> {
        vec![
            row("API ceiling (16 concurrent PATCHes, no watch)".into(), bare),
            row(
                format!("API ceiling (32 concurrent PATCHes, {FLOOR_LABEL})"),
                floor,
            ),
            row("netcm (qps 1000, burst 2000)".into(), netcm),
        ]
    }

    #[test]
    fn netcm_is_measured_against_the_floor_before_it_after_it_and_their_mean() {
        let mut rows = bare_floor_netcm(10.0, 12.0, 15.0);
        rows.push(row(
            format!("API ceiling (32 concurrent PATCHes, {FLOOR_LABEL}){AFTER_NETCM_SUFFIX}"),
            18.0,
        ));
        let r = ratios(&rows, "netcm (", "kube-controller-manager").expect("netcm's row");
        assert_eq!(r.over_bare, 1.5);
        assert_eq!(r.over_floor, Some(15.0 / 12.0));
        assert_eq!(r.over_floor_after, Some(15.0 / 18.0));
        assert_eq!(r.over_floor_around, Some(1.0));
    }

    #[test]
    fn netcm_is_measured_against_the_bare_ceiling_before_it_after_it_and_their_mean() {
        let mut rows = bare_floor_netcm(10.0, 12.0, 15.0);
        rows.push(row(
            format!("API ceiling (16 concurrent PATCHes, no watch){AFTER_NETCM_SUFFIX}"),
            20.0,
        ));
        let r = ratios(&rows, "netcm (", "kube-controller-manager").expect("netcm's row");
        assert_eq!(r.over_bare, 1.5);
        assert_eq!(r.over_bare_after, Some(0.75));
        assert_eq!(r.over_bare_around, Some(1.0));
        // The floor run again is not the bare ceiling run again.
        assert_eq!(r.over_floor_after, None);
    }

    #[test]
    fn without_a_floor_after_netcm_there_is_no_bracketed_ratio() {
        let rows = bare_floor_netcm(10.0, 12.0, 15.0);
        let r = ratios(&rows, "netcm (", "kube-controller-manager").expect("netcm's row");
        assert_eq!(r.over_floor, Some(15.0 / 12.0));
        assert_eq!(r.over_floor_after, None);
        assert_eq!(r.over_floor_around, None);
    }

    #[test]
    fn median_of_an_odd_count_is_the_middle_value() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
    }

    #[test]
    fn median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    #[test]
    fn median_of_nothing_is_none() {
        assert_eq!(median(Vec::new()), None);
    }
}
