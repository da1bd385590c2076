//! The command line as a user meets it: bad flags exit 2 with one line naming the flag and the rule,
//! before any API call; good ones get as far as the client configuration. Each file in `tests/cmd/` is
//! a transcript (`$` the command, `?` the exit code, then its output); `TRYCMD=overwrite` rewrites them
//! after a deliberate change of wording.

#[test]
fn the_command_line_transcripts_hold() {
    trycmd::TestCases::new().case("tests/cmd/*.md");
}
