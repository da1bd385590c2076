//! Duration flag values (`--leader-elect-lease-duration`, `--route-reconcile-period`, …, and the
//! `Retry-After`-style values the client reads): `parse_duration` must agree with Go's
//! `time.ParseDuration` (ported below, integer nanoseconds as Go computes them) on what it accepts and
//! on the value, except where netcm says it differs (it trims, refuses negatives and values over 1e10 s);
//! and `format_duration` must write a value that parses back to the same duration.

use netcm_manager::duration::{format_duration, parse_duration};

/// Go's `time.ParseDuration` (go/src/time/format.go), in nanoseconds; `None` where Go errs.
fn go_parse_duration(orig: &str) -> Option<i128> {
    let mut s = orig.as_bytes();
    let mut neg = false;
    if let Some(&c) = s.first() {
        if c == b'-' || c == b'+' {
            neg = c == b'-';
            s = &s[1..];
        }
    }
    if s == b"0" {
        return Some(0);
    }
    if s.is_empty() {
        return None;
    }
    let mut d: u64 = 0;
    while !s.is_empty() {
        if !(s[0] == b'.' || s[0].is_ascii_digit()) {
            return None;
        }
        // leadingInt
        let mut v: u64 = 0;
        let mut i = 0;
        while i < s.len() && s[i].is_ascii_digit() {
            if v > (1 << 63) / 10 {
                return None;
            }
            v = v * 10 + u64::from(s[i] - b'0');
            if v > 1 << 63 {
                return None;
            }
            i += 1;
        }
        let pre = i > 0;
        s = &s[i..];
        let (mut f, mut scale, mut post) = (0u64, 1f64, false);
        if s.first() == Some(&b'.') {
            s = &s[1..];
            // leadingFraction
            let mut i = 0;
            let mut overflow = false;
            while i < s.len() && s[i].is_ascii_digit() {
                if !overflow {
                    if f > ((1u64 << 63) - 1) / 10 {
                        overflow = true;
                    } else {
                        let y = f * 10 + u64::from(s[i] - b'0');
                        if y > 1 << 63 {
                            overflow = true;
                        } else {
                            f = y;
                            scale *= 10.0;
                        }
                    }
                }
                i += 1;
            }
            post = i > 0;
            s = &s[i..];
        }
        if !pre && !post {
            return None;
        }
        let i = s
            .iter()
            .position(|&c| c == b'.' || c.is_ascii_digit())
            .unwrap_or(s.len());
        if i == 0 {
            return None;
        }
        let unit: u64 = match &s[..i] {
            b"ns" => 1,
            b"us" => 1_000,
            u if u == "µs".as_bytes() || u == "μs".as_bytes() => 1_000,
            b"ms" => 1_000_000,
            b"s" => 1_000_000_000,
            b"m" => 60_000_000_000,
            b"h" => 3_600_000_000_000,
            _ => return None,
        };
        s = &s[i..];
        if v > (1 << 63) / unit {
            return None;
        }
        v *= unit;
        if f > 0 {
            v += (f as f64 * (unit as f64 / scale)) as u64;
            if v > 1 << 63 {
                return None;
            }
        }
        d += v;
        if d > 1 << 63 {
            return None;
        }
    }
    if neg {
        return Some(-(d as i128));
    }
    if d > (1 << 63) - 1 {
        return None;
    }
    Some(d as i128)
}

/// The checks, on one input as libFuzzer hands it over.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let ours = parse_duration(text);
    if let Ok(d) = ours {
        let written = format_duration(d);
        assert_eq!(
            parse_duration(&written),
            Ok(d),
            "{text:?} parsed as {d:?}, written as {written:?}"
        );
    }
    // Only where netcm means to read as Go does.
    if text.trim() != text || text.starts_with('-') {
        return;
    }
    let go = go_parse_duration(text);
    match (go, &ours) {
        (Some(ns), Ok(d)) => assert_eq!(
            d.as_nanos() as i128,
            ns,
            "{text:?}: Go reads {ns} ns, netcm {d:?}"
        ),
        (Some(ns), Err(e)) => assert!(
            ns > 10_000_000_000 * 1_000_000_000,
            "{text:?}: Go reads {ns} ns, netcm: {e}"
        ),
        (None, Ok(d)) => panic!("{text:?}: Go refuses it, netcm reads {d:?}"),
        (None, Err(_)) => {}
    }
}
