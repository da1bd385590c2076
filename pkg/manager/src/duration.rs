//! Go-style durations (`15s`, `2m`, `500ms`, `1h30m`), as kube-controller-manager's flags take them.

use std::time::Duration;

/// A duration flag value that cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {value:?}: {reason} (examples: 15s, 2m, 500ms, 1h30m)")]
pub struct ParseDurationError {
    value: String,
    reason: &'static str,
}

/// Parses a Go `time.ParseDuration` string as Go does: integer nanoseconds, a fraction below a
/// nanosecond cut off, at most 2^63-1 ns. Surrounding whitespace is ignored, and negative values are
/// rejected because no netcm flag takes one.
pub fn parse_duration(value: &str) -> Result<Duration, ParseDurationError> {
    let err = |reason| ParseDurationError {
        value: value.to_string(),
        reason,
    };
    let s = value.trim();
    if s.is_empty() {
        return Err(err("empty"));
    }
    if s.starts_with('-') {
        return Err(err("must not be negative"));
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(err("expected a number"));
    }
    let too_large = || err("too large");
    let mut total: u64 = 0;
    let mut rest = s.as_bytes();
    while !rest.is_empty() {
        let (whole, int_digits) = leading_int(rest).ok_or_else(too_large)?;
        rest = &rest[int_digits..];
        let (mut fraction, mut scale, mut fraction_digits) = (0, 1.0, 0);
        if let Some(after_dot) = rest.strip_prefix(b".") {
            (fraction, scale, fraction_digits) = leading_fraction(after_dot);
            rest = &after_dot[fraction_digits..];
        }
        if int_digits == 0 && fraction_digits == 0 {
            return Err(err("expected a number"));
        }
        let unit_len = rest
            .iter()
            .position(|b| b.is_ascii_digit() || *b == b'.')
            .unwrap_or(rest.len());
        let ns_per_unit: u64 = match &rest[..unit_len] {
            b"" => return Err(err("missing unit")),
            b"ns" => 1,
            b"us" => 1_000,
            u if u == "µs".as_bytes() || u == "μs".as_bytes() => 1_000,
            b"ms" => 1_000_000,
            b"s" => 1_000_000_000,
            b"m" => 60_000_000_000,
            b"h" => 3_600_000_000_000,
            _ => return Err(err("unknown unit (use ns, us, ms, s, m, h)")),
        };
        rest = &rest[unit_len..];
        let mut ns = whole.checked_mul(ns_per_unit).ok_or_else(too_large)?;
        if fraction > 0 {
            // As Go: a float64 is exact enough for a fraction of one unit (an hour is 3.6e12 ns).
            let part = (fraction as f64 * (ns_per_unit as f64 / scale)) as u64;
            ns = ns.checked_add(part).ok_or_else(too_large)?;
        }
        total = total
            .checked_add(ns)
            .filter(|&t| t <= i64::MAX as u64)
            .ok_or_else(too_large)?;
    }
    Ok(Duration::from_nanos(total))
}

/// The leading digits of `s` as an integer and how many there were; `None` past 2^63 (Go's `leadingInt`).
fn leading_int(s: &[u8]) -> Option<(u64, usize)> {
    let digits = s.iter().take_while(|b| b.is_ascii_digit()).count();
    let mut x: u64 = 0;
    for &c in &s[..digits] {
        x = x.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
        if x > 1 << 63 {
            return None;
        }
    }
    Some((x, digits))
}

/// The leading digits of a fraction: their value, 10^(digits used) and how many there were; digits past
/// what 63 bits hold are skipped, not an error (Go's `leadingFraction`).
fn leading_fraction(s: &[u8]) -> (u64, f64, usize) {
    let digits = s.iter().take_while(|b| b.is_ascii_digit()).count();
    let (mut x, mut scale) = (0u64, 1.0f64);
    for &c in &s[..digits] {
        if x > (1 << 63) / 10 || x * 10 + u64::from(c - b'0') > 1 << 63 {
            break;
        }
        x = x * 10 + u64::from(c - b'0');
        scale *= 10.0;
    }
    (x, scale, digits)
}

/// Formats a duration the way Go writes it, without its zero units (`1h30m`, `500ms`, `2us`), for logs of
/// the effective configuration and messages; [`parse_duration`] reads it back as the same duration.
pub fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".to_string();
    }
    if !ns.is_multiple_of(1_000_000_000) {
        return if ns.is_multiple_of(1_000_000) {
            format!("{}ms", ns / 1_000_000)
        } else if ns.is_multiple_of(1_000) {
            format!("{}us", ns / 1_000)
        } else {
            format!("{ns}ns")
        };
    }
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 || out.is_empty() {
        out.push_str(&format!("{s}s"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_style_durations_parse_to_the_same_values_as_go() {
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
    }

    #[test]
    fn a_duration_without_a_unit_or_with_a_bad_unit_is_rejected_with_the_value_named() {
        let e = parse_duration("15").expect_err("no unit");
        assert!(e.to_string().contains("\"15\""), "{e}");
        assert!(parse_duration("3d").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("s").is_err());
    }

    // The next three were found by fuzz/fuzz_targets/duration.rs, which reads each value beside a port
    // of Go's time.ParseDuration.

    #[test]
    fn a_sign_without_a_number_is_not_a_duration() {
        assert!(parse_duration("+").is_err(), "Go refuses it; it read as 0s");
        assert!(parse_duration(" + ").is_err());
        assert_eq!(
            parse_duration("+0"),
            Ok(Duration::ZERO),
            "Go reads it as zero"
        );
    }

    #[test]
    fn fractions_are_read_to_the_nanosecond_as_go_reads_them_not_through_float_seconds() {
        // Go cuts off what lies below a nanosecond; summed as float seconds this rounded up.
        assert_eq!(
            parse_duration(".5577770515s"),
            Ok(Duration::from_nanos(557_777_051))
        );
        // Go adds integer nanoseconds; in float seconds 100 days' magnitude left 0.3s a nanosecond off.
        assert_eq!(
            parse_duration("2400h0.3s"),
            Ok(Duration::new(8_640_000, 300_000_000))
        );
        assert_eq!(
            parse_duration(".515s.5515511ns5s.1515s.15s.551ns515s.55s.15115s.15s.5551ns"),
            Ok(Duration::from_nanos(521_667_650_000))
        );
    }

    #[test]
    fn a_formatted_duration_below_a_millisecond_parses_back_to_itself() {
        for d in [
            Duration::from_micros(2),
            Duration::from_micros(1_500),
            Duration::from_nanos(1),
            Duration::new(15, 1),
            Duration::new(9_223_372_036, 854_775_807),
        ] {
            let text = format_duration(d);
            assert_eq!(
                parse_duration(&text),
                Ok(d),
                "{d:?} was written as {text:?}"
            );
        }
    }

    #[test]
    fn durations_format_back_in_go_style() {
        assert_eq!(format_duration(Duration::from_secs(15)), "15s");
        assert_eq!(format_duration(Duration::from_secs(5400)), "1h30m");
        assert_eq!(format_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(format_duration(Duration::ZERO), "0s");
    }
}
