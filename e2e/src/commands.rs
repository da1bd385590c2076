//! Running a command to completion: its stdout, or a panic naming it with its status and output.

use std::io::Write;
use std::process::{Command, Stdio};

/// Runs `cmd` to completion with `stdin` as its input: its stdout, or a panic naming the command with
/// its output.
pub fn command_output(cmd: &mut Command, stdin: Option<&str>) -> String {
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
    checked_stdout(&what, child.wait_with_output().expect("wait"))
}

/// A finished command's stdout, or a panic naming the command (`what`) with its status and output.
pub fn checked_stdout(what: &str, out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
