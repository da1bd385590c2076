//! Rendering the chart with helm and applying what it renders, for the RBAC tests.

use super::*;

pub fn run(cmd: &mut Command, stdin: Option<&str>) -> String {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {what}: {e}"));
    let mut pipe = child.stdin.take().expect("stdin");
    pipe.write_all(stdin.unwrap_or_default().as_bytes())
        .expect("write stdin");
    drop(pipe);
    let out = child.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// helm, built from its Go module by hack/verify-chart.sh.
pub fn helm() -> PathBuf {
    let out = run(
        Command::new("bash")
            .arg(repo_root().join("hack/verify-chart.sh"))
            .arg("helm"),
        None,
    );
    PathBuf::from(out.trim())
}

pub fn kubectl(kubeconfig: &Path) -> Command {
    let mut cmd = Command::new(tool("kubectl"));
    cmd.env("KUBECONFIG", kubeconfig);
    cmd
}

/// The chart rendered by `helm template` into `NAMESPACE`, as JSON objects (kubectl does the YAML).
pub struct Rendering {
    objects: Vec<Value>,
}

impl Rendering {
    pub fn new(value_files: &[&str]) -> Rendering {
        let chart = repo_root().join("charts/netcm");
        let mut cmd = Command::new(helm());
        cmd.args(["template", RELEASE])
            .arg(&chart)
            .args(["--namespace", NAMESPACE]);
        for f in value_files {
            cmd.arg("-f").arg(chart.join(f));
        }
        let yaml = run(&mut cmd, None);
        let json = run(
            kubectl(&control_plane().kubeconfig).args([
                "create",
                "--dry-run=client",
                "-o",
                "json",
                "-f",
                "-",
            ]),
            Some(&yaml),
        );
        let objects = serde_json::Deserializer::from_str(&json)
            .into_iter::<Value>()
            .collect::<Result<Vec<_>, _>>()
            .expect("kubectl printed JSON objects");
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

/// Server-side applies `objects` as one List, as an operator's `kubectl apply --server-side` would.
pub fn apply(kubeconfig: &Path, objects: Vec<Value>) {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    run(
        kubectl(kubeconfig).args([
            "apply",
            "--server-side",
            "--force-conflicts",
            &format!("--field-manager={FIELD_MANAGER}"),
            "-f",
            "-",
        ]),
        Some(&list.to_string()),
    );
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
