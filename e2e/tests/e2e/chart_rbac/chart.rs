//! Rendering the chart with helm and applying what it renders, for the RBAC tests.

use super::*;
use netcm_e2e::chart::{chart_dir, render};

/// The chart rendered by `helm template` into `NAMESPACE`, as JSON objects (kubectl does the YAML).
pub struct Rendering {
    objects: Vec<Value>,
}

impl Rendering {
    pub fn new(value_files: &[&str]) -> Rendering {
        let args: Vec<String> = value_files
            .iter()
            .flat_map(|f| ["-f".to_string(), chart_dir().join(f).display().to_string()])
            .collect();
        let objects = render(&control_plane().kubeconfig, RELEASE, NAMESPACE, &args);
        Rendering { objects }
    }

    /// The chart with `--set` of each of `values` over the defaults.
    pub fn with_set(values: &[&str]) -> Rendering {
        let args: Vec<String> = values
            .iter()
            .flat_map(|v| ["--set".to_string(), v.to_string()])
            .collect();
        let objects = render(&control_plane().kubeconfig, RELEASE, NAMESPACE, &args);
        Rendering { objects }
    }

    pub fn all(&self, kind: &str) -> Vec<&Value> {
        self.objects.iter().filter(|o| o["kind"] == kind).collect()
    }

    pub fn one(&self, kind: &str) -> &Value {
        match self.all(kind).as_slice() {
            [o] => o,
            other => panic!(
                "expected one {kind} in the rendering, found {}",
                other.len()
            ),
        }
    }

    pub fn args(&self, kind: &str) -> Vec<String> {
        let args = &self.one(kind)["spec"]["template"]["spec"]["containers"][0]["args"];
        serde_json::from_value(args.clone()).expect("container args are strings")
    }

    /// The ServiceAccount the pods of the one `kind` (Deployment, DaemonSet) run as.
    pub fn service_account_of(&self, kind: &str) -> String {
        self.one(kind)["spec"]["template"]["spec"]["serviceAccountName"]
            .as_str()
            .unwrap_or("default")
            .to_string()
    }

    pub fn service_account(&self) -> String {
        self.one("ServiceAccount")["metadata"]["name"]
            .as_str()
            .expect("ServiceAccount name")
            .to_string()
    }

    /// The RBAC objects, with the rule `drop` = (kind, index) taken out of that role.
    pub fn rbac_without(&self, drop: Option<(&str, usize)>) -> Vec<Value> {
        RBAC_KINDS
            .iter()
            .flat_map(|k| self.all(k))
            .map(|o| {
                let mut o = o.clone();
                if let Some((kind, i)) = drop {
                    if o["kind"] == kind && o["metadata"]["name"] == RELEASE {
                        o["rules"].as_array_mut().expect("rules").remove(i);
                    }
                }
                o
            })
            .collect()
    }
}

/// Server-side applies `objects` under the tests' field manager.
pub fn apply(kubeconfig: &Path, objects: Vec<Value>) {
    netcm_e2e::chart::apply(kubeconfig, FIELD_MANAGER, objects);
}

/// The chart's args for the harness's `Netcm::start`: its own listener and verbosity flags dropped (the
/// harness sets them), `set` replacing the chart's values, `add` appended.
pub fn adapt(args: &[String], set: &[(&str, &str)], add: &[&str]) -> Vec<String> {
    const HARNESS: [&str; 4] = ["--bind-address", "--port", "--secure-port", "--v"];
    let mut out: Vec<String> = args
        .iter()
        .filter(|a| !HARNESS.contains(&flag_name(a)))
        .map(|a| match set.iter().find(|(f, _)| *f == flag_name(a)) {
            Some((f, v)) => format!("{f}={v}"),
            None => a.clone(),
        })
        .collect();
    out.extend(add.iter().map(|s| s.to_string()));
    out
}

pub fn flag_name(arg: &str) -> &str {
    arg.split('=').next().unwrap_or(arg)
}
