//! `docs/flags.md`, rendered from clap's definitions: the doc comments on the flag structs are the one
//! source of every flag's name, default, environment variable, values and meaning. The test below fails
//! when the committed page differs from what the code defines, and rewrites it when asked
//! (`NETCM_UPDATE_DOCS=1 cargo test -p netcm flags_doc`), so the page cannot drift from `--help`.

use clap::{Arg, ArgAction, Command};

/// The page for the controller manager's command line (`root`) and `netcm check`'s (`check`).
pub(crate) fn render(root: &Command, check: &Command) -> String {
    let mut out = String::from(
        "# Flags\n\n\
         <!-- Generated from clap's definitions by cmd/netcm/src/flags_doc.rs; edit the doc comments on the \
         flag structs, then `NETCM_UPDATE_DOCS=1 cargo test -p netcm flags_doc`. -->\n\n\
         netcm uses kube-controller-manager's and flannel's flag names where they overlap. Booleans take a \
         value as KCM's do (`--leader-elect=false`; a bare `--leader-elect` means true); durations are \
         Go-style (`15s`, `2m`, `500ms`); lists are comma-separated; a later flag wins over an earlier one. \
         A bad flag prints one line naming it and exits 2, before any API call. `netcm --help` prints the \
         same text as this page.\n",
    );
    for (heading, args) in groups(root) {
        out.push_str(&format!("\n## {heading}\n\n"));
        table(&mut out, &args);
    }
    out.push_str(
        "\n## `netcm check`\n\nA read-only diagnosis of netcm on a live cluster (`netcm check [node NAME]`; \
         the same as `kubectl netcm check`). Its flags go before or after `node NAME`.\n\n",
    );
    let check_args: Vec<&Arg> = visible(check).collect();
    table(&mut out, &check_args);
    out
}

/// The visible flags of `cmd` (not `--help` or `--version`), in the order `--help` lists them.
fn visible(cmd: &Command) -> impl Iterator<Item = &Arg> {
    cmd.get_arguments().filter(|a| {
        !a.is_hide_set()
            && !a.is_positional()
            && !matches!(a.get_action(), ArgAction::Help | ArgAction::Version)
    })
}

/// The flags of `cmd` grouped by their `--help` heading, the manager's own (no heading) first.
fn groups(cmd: &Command) -> Vec<(String, Vec<&Arg>)> {
    let mut groups: Vec<(String, Vec<&Arg>)> = Vec::new();
    for arg in visible(cmd) {
        let heading = arg.get_help_heading().unwrap_or("Manager").to_string();
        match groups.iter_mut().find(|(h, _)| *h == heading) {
            Some((_, args)) => args.push(arg),
            None => groups.push((heading, vec![arg])),
        }
    }
    groups
}

fn table(out: &mut String, args: &[&Arg]) {
    out.push_str("| flag | default | meaning |\n|---|---|---|\n");
    for arg in args {
        out.push_str(&format!(
            "| {} | {} | {} |\n",
            cell(&names(arg)),
            cell(&default(arg)),
            cell(&meaning(arg))
        ));
    }
}

/// `--long` (and `-s`), with the environment variable that also sets it.
fn names(arg: &Arg) -> String {
    let mut names = Vec::new();
    if let Some(short) = arg.get_short() {
        names.push(format!("`-{short}`"));
    }
    if let Some(long) = arg.get_long() {
        names.push(format!("`--{long}`"));
    }
    let mut text = names.join(", ");
    if let Some(env) = arg.get_env() {
        text.push_str(&format!(" (env `{}`)", env.to_string_lossy()));
    }
    text
}

fn default(arg: &Arg) -> String {
    let values: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .filter(|v| !v.is_empty())
        .collect();
    if values.is_empty() {
        "—".into()
    } else {
        format!("`{}`", values.join(","))
    }
}

/// The long help if there is one (it holds the short one), then the values a closed set allows.
fn meaning(arg: &Arg) -> String {
    let mut text = arg
        .get_long_help()
        .or_else(|| arg.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default();
    let values: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| match v.get_help() {
            Some(help) => format!("`{}` ({help})", v.get_name()),
            None => format!("`{}`", v.get_name()),
        })
        .collect();
    // Booleans list true and false: saying so adds nothing.
    if !values.is_empty() && !matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse) {
        let is_bool = values.len() == 2 && values[0] == "`true`" && values[1] == "`false`";
        if !is_bool {
            text.push_str(&format!(". Values: {}", values.join(", ")));
        }
    }
    text
}

/// Text fit for one table cell: no line breaks, no bare `|`.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// The committed page, from the workspace root.
    fn page_path() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/flags.md")
    }

    #[test]
    fn docs_flags_md_is_what_the_flag_definitions_say() {
        let rendered = render(&crate::Cli::command(), &crate::check::CheckCli::command());
        let path = page_path();
        if std::env::var_os("NETCM_UPDATE_DOCS").is_some() {
            std::fs::write(&path, &rendered).expect("write docs/flags.md");
            return;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == rendered,
            "docs/flags.md differs from the flag definitions; run `NETCM_UPDATE_DOCS=1 cargo test -p netcm flags_doc` and commit the page"
        );
    }

    #[test]
    fn every_flag_of_every_controller_is_on_the_page() {
        let rendered = render(&crate::Cli::command(), &crate::check::CheckCli::command());
        for long in [
            "kube-api-qps",
            "cluster-cidr",
            "annotation-prefix",
            "route-mode",
            "as",
        ] {
            assert!(
                rendered.contains(&format!("`--{long}`")),
                "--{long} missing"
            );
        }
        for heading in [
            "## Manager",
            "## subnet-allocator",
            "## node-annotation-syncer",
            "## route-controller",
        ] {
            assert!(rendered.contains(heading), "{heading} missing");
        }
    }

    #[test]
    fn a_cell_keeps_a_pipe_and_a_line_break_from_breaking_the_table() {
        assert_eq!(cell("a | b\n  c"), "a \\| b c");
    }
}
