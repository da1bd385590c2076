//! What `netcm check` prints: one line per finding (✓ / ! / ✗ / -), what is wrong, and the one command
//! or change that fixes it; or the same as JSON for scripts. Exit 1 when any finding failed.

use std::borrow::Cow;

use serde::Serialize;

/// How a finding ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Healthy.
    Ok,
    /// Not checked (nothing to check, or not allowed to look); never fails the run.
    Skip,
    /// Worth a look, not broken (yet).
    Warn,
    /// Broken: `netcm check` exits 1.
    Fail,
}

impl Status {
    fn symbol(self) -> &'static str {
        match self {
            Status::Ok => "✓",
            Status::Skip => "-",
            Status::Warn => "!",
            Status::Fail => "✗",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Which check: api, rbac, leader, config, pool, space, waiting, cidrs, allocators, claims, migrations, leases, routes, node.
    pub check: &'static str,
    /// Its status.
    pub status: Status,
    /// What was found, naming the objects.
    pub message: String,
    /// The one command or change that fixes it (failures and warnings).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// The Nodes it is about, for scripts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
}

impl Finding {
    /// A healthy finding.
    pub fn ok(check: &'static str, message: impl Into<String>) -> Finding {
        Finding {
            check,
            status: Status::Ok,
            message: message.into(),
            fix: None,
            nodes: Vec::new(),
        }
    }

    /// A check that did not run, and why.
    pub fn skip(check: &'static str, message: impl Into<String>) -> Finding {
        Finding {
            status: Status::Skip,
            ..Finding::ok(check, message)
        }
    }

    /// A warning with its fix.
    pub fn warn(
        check: &'static str,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) -> Finding {
        Finding {
            status: Status::Warn,
            fix: Some(fix.into()),
            ..Finding::ok(check, message)
        }
    }

    /// A failure with its fix.
    pub fn fail(
        check: &'static str,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) -> Finding {
        Finding {
            status: Status::Fail,
            fix: Some(fix.into()),
            ..Finding::ok(check, message)
        }
    }

    /// The Nodes this finding is about.
    pub fn about<I: IntoIterator<Item = S>, S: Into<String>>(mut self, nodes: I) -> Finding {
        self.nodes = nodes.into_iter().map(Into::into).collect();
        self
    }
}

/// Everything `netcm check` found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// False when any finding failed.
    pub ok: bool,
    /// The findings, in check order.
    pub checks: Vec<Finding>,
    /// `netcm check node NAME`: the verdict in one sentence.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
}

impl Report {
    /// A report of `checks`, with its overall result.
    pub fn new(checks: Vec<Finding>, verdict: Option<String>) -> Report {
        Report {
            ok: checks.iter().all(|c| c.status != Status::Fail),
            checks,
            verdict,
        }
    }

    /// The human form: one line per finding, the fix after an arrow, then the verdict. Messages quote
    /// what the API holds (annotations a kubelet wrote, Event notes, names), so control characters are
    /// printed escaped ([`printable`]).
    pub fn text(&self) -> String {
        let mut out = String::new();
        for c in &self.checks {
            out.push_str(&format!(
                "{} {}: {}",
                c.status.symbol(),
                c.check,
                printable(&c.message)
            ));
            if let Some(fix) = &c.fix {
                out.push_str(&format!(" → {}", printable(fix)));
            }
            out.push('\n');
        }
        if let Some(v) = &self.verdict {
            out.push_str(&format!("verdict: {}\n", printable(v)));
        }
        out
    }

    /// The JSON form.
    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

/// `text` with every character a terminal would act on written as its escape (`\u{1b}`, `\n`): control
/// characters (C0, DEL, C1 — ESC and CSI start the sequences that move the cursor, retitle the window or
/// clear the screen; a line break would forge a finding line) and the bidirectional overrides that make
/// text read other than it is.
pub fn printable(text: &str) -> Cow<'_, str> {
    let acts = |c: char| {
        c.is_control()
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(acts) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if acts(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_failed_finding_fails_the_report_and_warnings_do_not() {
        let warn = Report::new(
            vec![
                Finding::ok("api", "up"),
                Finding::warn("pool", "91 %", "grow it"),
            ],
            None,
        );
        assert!(warn.ok);
        let fail = Report::new(vec![Finding::fail("leader", "none", "start netcm")], None);
        assert!(!fail.ok);
    }

    #[test]
    fn control_characters_from_the_api_are_printed_escaped_and_cannot_break_a_line() {
        let r = Report::new(
            vec![Finding::fail(
                "node",
                "Node a\u{1b}[31m has\r\nfake ✓ line",
                "kubectl\u{7} \u{202e}fix",
            )],
            Some("bad\u{9b}2J".into()),
        );
        assert_eq!(
            r.text(),
            "✗ node: Node a\\u{1b}[31m has\\r\\nfake ✓ line → kubectl\\u{7} \\u{202e}fix\nverdict: bad\\u{9b}2J\n"
        );
    }

    #[test]
    fn each_finding_is_one_line_with_its_symbol_and_fix() {
        let r = Report::new(
            vec![
                Finding::ok("api", "reachable"),
                Finding::fail("leader", "no leader", "start netcm"),
            ],
            Some("fine".into()),
        );
        assert_eq!(
            r.text(),
            "✓ api: reachable\n✗ leader: no leader → start netcm\nverdict: fine\n"
        );
        let json: serde_json::Value = serde_json::from_str(&r.json()).expect("json");
        assert_eq!(json["ok"], false);
        assert_eq!(json["checks"][1]["status"], "fail");
        assert_eq!(json["checks"][1]["fix"], "start netcm");
    }
}
