//! `kubectl netcm …`: the same binary installed as `kubectl-netcm` (krew's naming for plugin `netcm`).
//!
//! kubectl finds `kubectl-netcm` on `PATH` and runs it with the words after `kubectl netcm`. As a plugin
//! netcm offers its operator-facing command only, `check`: the controller manager itself is a cluster
//! component, never something to start from a laptop's kubectl.

use std::path::Path;
use std::process::ExitCode;

/// The executable name that makes this binary the kubectl plugin.
pub const PLUGIN_BINARY: &str = "kubectl-netcm";

/// How the plugin is called on the command line, for help and error messages.
const PLUGIN_COMMAND: &str = "kubectl netcm";

const HELP: &str = "Diagnose netcm, the network controller manager, on the cluster kubectl points at.

Usage:
  kubectl netcm check [flags]            every finding: API, RBAC, leader, pools, waiting Nodes, claims, leases
  kubectl netcm check node NAME [flags]  everything about one Node, and a one-sentence verdict
  kubectl netcm version                  the plugin's version

Read-only. The cluster is KUBECONFIG's (or --kubeconfig after `check`); `kubectl netcm check --help`
lists the flags. Exit 0: nothing failed; 1: something did; 2: bad usage.";

/// Whether this process was started under the plugin's name (`argv[0]`'s file name).
pub fn invoked_as_plugin(argv0: &str) -> bool {
    Path::new(argv0).file_name().and_then(|n| n.to_str()) == Some(PLUGIN_BINARY)
}

/// What the plugin does with the words after `kubectl netcm`.
#[derive(Debug, PartialEq, Eq)]
enum Command {
    Help,
    Version,
    Check(Vec<String>),
    Unknown(String),
}

fn command(mut args: Vec<String>) -> Command {
    if args.is_empty() {
        return Command::Help;
    }
    let first = args.remove(0);
    match first.as_str() {
        "check" => Command::Check(args),
        "help" | "-h" | "--help" => Command::Help,
        "version" | "--version" | "-V" => Command::Version,
        _ => Command::Unknown(first),
    }
}

/// Runs the plugin with the words after `kubectl netcm`.
pub fn main(args: impl IntoIterator<Item = String>) -> ExitCode {
    match command(args.into_iter().collect()) {
        Command::Help => {
            println!("{HELP}");
            ExitCode::SUCCESS
        }
        Command::Version => {
            println!("{PLUGIN_BINARY} {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Check(rest) => crate::check::main(&format!("{PLUGIN_COMMAND} check"), rest),
        Command::Unknown(word) => {
            netcm_manager::logging::sink::write_stderr_line(&format!(
                "error: unknown command {word:?} for {PLUGIN_COMMAND:?}: the plugin runs `{PLUGIN_COMMAND} check [node NAME]` (see `{PLUGIN_COMMAND} --help`); the controller manager itself runs as `netcm` in the cluster"
            ));
            ExitCode::from(crate::EXIT_USAGE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn only_the_file_name_kubectl_netcm_makes_the_binary_a_plugin() {
        assert!(invoked_as_plugin("kubectl-netcm"));
        assert!(invoked_as_plugin("/home/me/.krew/bin/kubectl-netcm"));
        assert!(!invoked_as_plugin("/usr/local/bin/netcm"));
        assert!(!invoked_as_plugin("kubectl-netcm-old"));
        assert!(!invoked_as_plugin(""));
    }

    #[test]
    fn check_passes_every_following_word_through_and_nothing_else_starts_the_manager() {
        assert_eq!(
            command(words("check node n1 -o json")),
            Command::Check(words("node n1 -o json"))
        );
        assert_eq!(command(vec![]), Command::Help);
        assert_eq!(command(words("--help")), Command::Help);
        assert_eq!(command(words("version")), Command::Version);
        assert_eq!(
            command(words("--controllers=* --leader-elect")),
            Command::Unknown("--controllers=*".into())
        );
    }
}
