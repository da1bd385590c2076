//! The committed corpus of every fuzz target (`corpus/<target>/`) replayed through the target's checks
//! in an ordinary build: what a libFuzzer run starts by doing, without nightly, cargo-fuzz or libFuzzer,
//! so a change that breaks a check on an input the fuzzer once found fails `cargo test`. Coverage-guided
//! runs, which find new inputs, are `hack/fuzz.sh`.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Once};
use std::thread;

use netcm_fuzz::targets::{Check, ALL};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// How many failures of one target are printed; the count says how many more there were.
const SHOWN: usize = 20;

/// The fuzz binaries cargo-fuzz builds, `(name, path)` of each `[[bin]]` in Cargo.toml, read by hand
/// since the workspace's Cargo.lock has no TOML parser to lean on.
fn bins() -> Vec<(String, String)> {
    let manifest = std::fs::read_to_string(Path::new(ROOT).join("Cargo.toml")).expect("Cargo.toml");
    let mut bins = Vec::new();
    let mut in_bin = false;
    let (mut name, mut path) = (None, None);
    let value = |line: &str, key: &str| {
        let (k, v) = line.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"').to_string())
    };
    for line in manifest.lines().map(str::trim).chain(["[end]"]) {
        if line.starts_with('[') {
            if in_bin {
                bins.push((
                    name.take().expect("a [[bin]] without a name"),
                    path.take().expect("a [[bin]] without a path"),
                ));
            }
            in_bin = line == "[[bin]]";
        } else if in_bin {
            name = name.or_else(|| value(line, "name"));
            path = path.or_else(|| value(line, "path"));
        }
    }
    bins
}

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(ROOT).join("corpus").join(target)
}

/// The files of `corpus/<target>/`, sorted so that failures come out in the same order every run.
fn corpus(target: &str) -> Vec<PathBuf> {
    let dir = corpus_dir(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("a corpus directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

fn check_of(target: &str) -> Option<Check> {
    ALL.iter().find(|(n, _)| *n == target).map(|&(_, c)| c)
}

thread_local! {
    /// Set on the replay's threads, whose panics are failures to collect rather than to print.
    static REPLAYING: Cell<bool> = const { Cell::new(false) };
    /// The last panic of this thread while replaying: where and what, as the default hook prints it.
    static CAUGHT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// A panic hook that keeps a replayed input's panic for the report (with its location, which the
/// payload alone lacks) and leaves every other thread's panic to the default hook.
fn catch_panics_of_the_replay() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if REPLAYING.with(Cell::get) {
                CAUGHT.with(|c| *c.borrow_mut() = Some(info.to_string().replace('\n', " ")));
            } else {
                default(info);
            }
        }));
    });
}

#[derive(Default)]
struct Replayed {
    files: usize,
    failures: Vec<String>,
}

#[test]
fn every_fuzz_binary_has_a_check_a_committed_corpus_and_runs_that_check() {
    let bins = bins();
    assert!(!bins.is_empty(), "no [[bin]] in Cargo.toml");
    let mut names: Vec<&str> = bins.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    let mut checked: Vec<&str> = ALL.iter().map(|&(n, _)| n).collect();
    checked.sort_unstable();
    assert_eq!(
        names, checked,
        "Cargo.toml's [[bin]]s and netcm_fuzz::targets::ALL name different targets"
    );
    for (name, path) in &bins {
        let source = std::fs::read_to_string(Path::new(ROOT).join(path)).expect("the bin's source");
        assert!(
            source.contains(&format!("netcm_fuzz::targets::{name}::")),
            "{path} does not run netcm_fuzz::targets::{name}, so the replay checks other code than it"
        );
        assert!(
            !corpus(name).is_empty(),
            "{} is empty or missing: {name} has no committed corpus to replay",
            corpus_dir(name).display()
        );
    }
    let dirs = std::fs::read_dir(Path::new(ROOT).join("corpus")).expect("corpus/");
    for d in dirs {
        let d = d.expect("a corpus/ entry").file_name();
        let d = d.to_string_lossy();
        assert!(
            names.contains(&&*d),
            "corpus/{d} belongs to no [[bin]] in Cargo.toml"
        );
    }
}

#[test]
fn every_committed_input_of_every_fuzz_target_passes_its_checks() {
    let mut work = Vec::new();
    let mut replayed = BTreeMap::new();
    for (name, _) in bins() {
        let check = check_of(&name).unwrap_or_else(|| {
            panic!("no check in netcm_fuzz::targets::ALL for the [[bin]] {name}")
        });
        // libFuzzer runs the empty input before the corpus; so does the replay (`None`).
        work.push((name.clone(), check, None));
        work.extend(
            corpus(&name)
                .into_iter()
                .map(|f| (name.clone(), check, Some(f))),
        );
        replayed.insert(name, Replayed::default());
    }
    catch_panics_of_the_replay();
    let next = AtomicUsize::new(0);
    let replayed = Mutex::new(replayed);
    let workers = thread::available_parallelism().map_or(1, |n| n.get());
    thread::scope(|s| {
        for _ in 0..workers {
            thread::Builder::new()
                // The fuzz binaries run the checks on the main thread's 8 MiB; a debug build's deeper
                // frames get room to spare, so only a real runaway recursion overflows.
                .stack_size(64 << 20)
                .spawn_scoped(s, || {
                    REPLAYING.with(|r| r.set(true));
                    while let Some((target, check, file)) =
                        work.get(next.fetch_add(1, Ordering::Relaxed))
                    {
                        let data = file.as_ref().map_or(Ok(Vec::new()), std::fs::read);
                        let why = match data {
                            Ok(data) => panic::catch_unwind(AssertUnwindSafe(|| check(&data)))
                                .err()
                                .map(|_| {
                                    let caught = CAUGHT.with(|c| c.borrow_mut().take());
                                    caught.unwrap_or_else(|| "panicked".to_string())
                                }),
                            Err(e) => Some(format!("cannot be read: {e}")),
                        };
                        let failure = why.map(|why| match file {
                            Some(f) => {
                                format!("{}: {why}", f.strip_prefix(ROOT).unwrap_or(f).display())
                            }
                            None => format!("the empty input: {why}"),
                        });
                        let mut replayed = replayed.lock().unwrap_or_else(|e| e.into_inner());
                        let r = replayed.get_mut(target).expect("a target of the work list");
                        r.files += usize::from(file.is_some());
                        r.failures.extend(failure);
                    }
                })
                .expect("a replay thread");
        }
    });

    let replayed = replayed.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut report = Vec::new();
    for (target, r) in &replayed {
        assert!(r.files > 0, "no corpus file of {target} was replayed");
        if r.failures.is_empty() {
            continue;
        }
        report.push(format!(
            "{target}: {} failures among its {} committed inputs and the empty input",
            r.failures.len(),
            r.files
        ));
        report.extend(r.failures.iter().take(SHOWN).map(|f| format!("  {f}")));
        if r.failures.len() > SHOWN {
            report.push(format!("  … and {} more", r.failures.len() - SHOWN));
        }
    }
    assert!(report.is_empty(), "\n{}", report.join("\n"));
}
