//! Go-style durations (`15s`, `2m`, `500ms`, `1h30m`), as kube-controller-manager's flags take them.

use std::time::Duration;

/// A duration flag value that cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {value:?}: {reason} (examples: 15s, 2m, 500ms, 1h30m)")]
pub struct ParseDurationError {
    value: String,
    reason: &'static str,
}

/// Parses a Go `time.ParseDuration` string; negative values are rejected because no netcm flag takes one.
pub fn parse_duration(value: &str) -> Result<Duration, ParseDurationError> {
    let err = |reason| ParseDurationError {
        value: value.to_string(),
        reason,
    };
    let s = value.trim();
    if s.is_empty() {
        return Err(err("empty"));
    }
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.starts_with('-') {
        return Err(err("must not be negative"));
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| err("missing unit"))?;
        if num_len == 0 {
            return Err(err("expected a number"));
        }
        let number: f64 = rest[..num_len]
            .parse()
            .map_err(|_| err("malformed number"))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds_per_unit = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(err("unknown unit (use ns, us, ms, s, m, h)")),
        };
        rest = &rest[unit_len..];
        total += number * seconds_per_unit;
    }
    if !total.is_finite() || total > 1e10 {
        return Err(err("too large"));
    }
    Ok(Duration::from_secs_f64(total))
}

/// Formats a duration the way Go prints it, for logs of the effective configuration.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".to_string();
    }
    if !ms.is_multiple_of(1000) {
        return format!("{ms}ms");
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

    #[test]
    fn durations_format_back_in_go_style() {
        assert_eq!(format_duration(Duration::from_secs(15)), "15s");
        assert_eq!(format_duration(Duration::from_secs(5400)), "1h30m");
        assert_eq!(format_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(format_duration(Duration::ZERO), "0s");
    }
}
