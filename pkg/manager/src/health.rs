//! Named health checks behind `/healthz`, `/livez` and `/readyz`.

use std::sync::Arc;

use parking_lot::RwLock;

/// A check: Ok, or the reason it fails.
pub type Check = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// A set of named checks; cheap to clone, checks can be added while serving.
#[derive(Clone, Default)]
pub struct HealthChecks {
    checks: Arc<RwLock<Vec<(String, Check)>>>,
}

impl HealthChecks {
    /// Adds (or replaces) a named check.
    pub fn add(&self, name: &str, check: Check) {
        let mut checks = self.checks.write();
        checks.retain(|(n, _)| n != name);
        checks.push((name.to_string(), check));
    }

    /// Removes a named check.
    pub fn remove(&self, name: &str) {
        let mut checks = self.checks.write();
        checks.retain(|(n, _)| n != name);
    }

    /// Runs every check (or only `only`); returns overall success and the per-check report lines
    /// in the apiserver's format (`[+]name ok` / `[-]name failed: reason`). `None` if `only` is unknown.
    pub fn run(&self, only: Option<&str>) -> Option<(bool, String)> {
        let checks = self.checks.read();
        let mut ok = true;
        let mut report = String::new();
        let mut matched = false;
        for (name, check) in checks.iter() {
            if only.is_some_and(|o| o != name) {
                continue;
            }
            matched = true;
            match check() {
                Ok(()) => report.push_str(&format!("[+]{name} ok\n")),
                Err(reason) => {
                    ok = false;
                    report.push_str(&format!("[-]{name} failed: {reason}\n"));
                }
            }
        }
        if only.is_some() && !matched {
            return None;
        }
        Some((ok, report))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_failing_check_fails_the_whole_set_but_not_the_others_alone() {
        let h = HealthChecks::default();
        h.add("ping", Arc::new(|| Ok(())));
        h.add("broken", Arc::new(|| Err("no".into())));
        let (ok, report) = h.run(None).expect("all");
        assert!(!ok);
        assert!(
            report.contains("[+]ping ok") && report.contains("[-]broken failed: no"),
            "{report}"
        );
        assert_eq!(h.run(Some("ping")).map(|r| r.0), Some(true));
        assert!(h.run(Some("missing")).is_none());
    }
}
