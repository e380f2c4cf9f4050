//! The command line as operators use it: piped into `head` or `less`, completed
//! by their shell, read with `man`, and started the way the README says.
use std::{
    net::{SocketAddr, SocketAddrV4},
    os::unix::process::ExitStatusExt as _,
    path::Path,
    process::{Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use socklb_tests::{
    Agent, ManifestDir, NamedServer, Sandbox, agent_bin, node_yaml, service_yaml, slice_yaml,
};

/// What a run left: how it ended and what it said on stderr.
struct Ended {
    what: String,
    status: ExitStatus,
    stderr: String,
}

impl Ended {
    /// No panic, no backtrace, no complaint about the pipe.
    fn assert_quiet(&self) {
        for noise in ["panicked", "RUST_BACKTRACE", "Broken pipe", "error:"] {
            assert!(
                !self.stderr.contains(noise),
                "{}: stderr holds {noise:?}:\n{}",
                self.what,
                self.stderr
            );
        }
    }

    /// Ended as `cat` ends when its reader goes away: killed by SIGPIPE (141 in the shell).
    fn assert_sigpipe(&self) {
        self.assert_quiet();
        assert_eq!(
            self.status.signal(),
            Some(libc::SIGPIPE),
            "{}: must die of SIGPIPE as a Unix tool does, ended {:?}:\n{}",
            self.what,
            self.status,
            self.stderr
        );
    }

    /// Into `head -c 10`: short outputs fit in the pipe before `head` exits and succeed;
    /// longer ones meet the closed pipe.
    fn assert_fine_in_a_pipe(&self) {
        self.assert_quiet();
        assert!(
            self.status.success() || self.status.signal() == Some(libc::SIGPIPE),
            "{}: ended {:?} in a pipe:\n{}",
            self.what,
            self.status,
            self.stderr
        );
    }
}

fn socklb(args: &[&str]) -> Command {
    let mut command = Command::new(agent_bin());
    command
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// `socklb ARGS | head -c 10`; `meanwhile` runs until socklb ends (traffic for a trace).
fn into_head(args: &[&str], mut meanwhile: impl FnMut()) -> Ended {
    let mut head = Command::new("head")
        .args(["-c", "10"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn head");
    let mut child = socklb(args)
        .stdout(head.stdin.take().expect("head's stdin"))
        .spawn()
        .expect("spawn socklb");
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("try_wait").is_none() {
        assert!(
            Instant::now() < deadline,
            "socklb {args:?} | head -c 10 did not end within 30 s"
        );
        meanwhile();
        std::thread::sleep(Duration::from_millis(50));
    }
    head.wait().expect("wait for head");
    ended(args, child)
}

/// socklb with stdout a pipe whose reader is gone before it writes: EPIPE every time.
fn into_closed_pipe(args: &[&str]) -> Ended {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let child = socklb(args).stdout(writer).spawn().expect("spawn socklb");
    ended(args, child)
}

fn ended(args: &[&str], child: std::process::Child) -> Ended {
    let output = child.wait_with_output().expect("wait for socklb");
    Ended {
        what: format!("socklb {}", args.join(" ")),
        status: output.status,
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Every subcommand that prints, piped into `head -c 10` and into a pipe already closed:
/// no panic, the conventional status. `trace` is stopped by its reader going away, with
/// events (it notices at a write) and without (it notices by itself), and by Ctrl-C; each
/// time it gives its lease back at once.
#[test]
fn every_printing_subcommand_ends_quietly_when_its_reader_goes_away() {
    let sandbox = Sandbox::new("cli-pipes");
    let backend: SocketAddrV4 = "127.0.31.1:8080".parse().expect("address");
    let _server = NamedServer::tcp("b1", backend);
    let manifests = ManifestDir::new(&sandbox);
    manifests.write("node.yaml", &node_yaml("node-a", "z1", "10.0.0.1"));
    // Many Services: `inspect` and `explain` print far more than `head` reads.
    for index in 0..300 {
        let name = format!("web{index}");
        let vip = format!("10.96.{}.{}", index / 200, index % 200 + 10);
        manifests.write(&format!("{name}.yaml"), &service_yaml(&name, &vip, 80, ""));
        manifests.write(
            &format!("{name}-slice.yaml"),
            &slice_yaml(
                &name,
                &name,
                8080,
                &[(&backend.ip().to_string(), "node-a", "z1", "")],
                false,
            ),
        );
    }
    let agent = Agent::start(&sandbox, &manifests.path, "node-a", &[]);
    let pins = sandbox
        .pin_dir
        .to_str()
        .expect("a UTF-8 pin dir")
        .to_owned();
    let manifest_dir = manifests.path.to_str().expect("a UTF-8 path").to_owned();
    let explain = [
        "explain",
        "--source",
        "file",
        "--node-name",
        "node-a",
        "--manifests",
        &manifest_dir,
    ];
    let empty_pins = format!("{pins}-none");
    let commands: Vec<Vec<&str>> = vec![
        vec!["version"],
        vec!["--version"],
        vec!["--help"],
        vec!["run", "--help"],
        vec!["metrics-names"],
        vec!["completion", "bash"],
        vec!["completion", "zsh"],
        vec!["completion", "fish"],
        vec!["man"],
        vec!["inspect", "--bpffs", &pins],
        vec!["inspect", "--bpffs", &pins, "-o", "json"],
        [&explain[..], &["-o", "table"]].concat(),
        [&explain[..], &["-o", "json"]].concat(),
        vec!["cleanup", "--bpffs", &empty_pins],
    ];
    for args in &commands {
        into_head(args, || {}).assert_fine_in_a_pipe();
        into_closed_pipe(args).assert_sigpipe();
    }
    let vip: SocketAddr = "10.96.0.10:80".parse().expect("address");
    for output in ["table", "json"] {
        let trace = ["trace", "--bpffs", &pins, "-o", output];
        // Events to write: the pipe closes under them.
        let piped = into_head(&trace, || {
            sandbox.probe("tcp", vip, 1);
        });
        piped.assert_fine_in_a_pipe();
        // Nothing to write: the session sees its reader gone by itself.
        into_closed_pipe(&trace).assert_sigpipe();
        assert_eq!(
            control(&sandbox.pin_dir),
            socklb_abi::TraceControl::default(),
            "socklb trace -o {output} left its lease behind"
        );
    }
    // `socklb trace | grep` stopped by Ctrl-C: the session gives its lease back at once.
    let trace = ["trace", "--bpffs", &pins];
    let child = socklb(&trace)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn socklb trace");
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(10);
    while control(&sandbox.pin_dir).session_pid != pid {
        assert!(
            Instant::now() < deadline,
            "the trace took no lease within 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = libc::pid_t::try_from(pid).expect("a pid");
    // SAFETY: a signal to our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0, "kill -INT");
    let interrupted = ended(&trace, child);
    interrupted.assert_quiet();
    assert!(
        interrupted.status.success(),
        "Ctrl-C ends a trace normally: {:?}\n{}",
        interrupted.status,
        interrupted.stderr
    );
    assert_eq!(
        control(&sandbox.pin_dir),
        socklb_abi::TraceControl::default(),
        "an interrupted trace left its lease behind"
    );
    agent.stop();
}

fn control(pin_dir: &Path) -> socklb_abi::TraceControl {
    use aya::maps::{Array, Map, MapData};
    let data =
        MapData::from_pin(pin_dir.join(socklb_abi::map_names::TRACE_CONTROL)).expect("control map");
    let array: Array<_, socklb_abi::TraceControl> =
        Array::try_from(Map::Array(data)).expect("an array");
    array.get(&0, 0).expect("the control entry")
}

fn stdout_of(args: &[&str]) -> String {
    let output = socklb(args).output().expect("run socklb");
    assert!(
        output.status.success(),
        "socklb {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

/// The subcommands an operator completes and reads about.
const SUBCOMMANDS: [&str; 8] = [
    "run",
    "explain",
    "inspect",
    "trace",
    "cleanup",
    "version",
    "completion",
    "man",
];

/// Completions for bash, zsh and fish and the man page come from the parser's own
/// definitions: each names every subcommand, the bash script parses, and the man page
/// documents the flags of each subcommand.
#[test]
fn completions_and_the_man_page_cover_every_subcommand() {
    for shell in ["bash", "zsh", "fish"] {
        let script = stdout_of(&["completion", shell]);
        for subcommand in SUBCOMMANDS {
            assert!(
                script.contains(subcommand),
                "the {shell} completion lacks {subcommand}"
            );
        }
    }
    let bash = stdout_of(&["completion", "bash"]);
    let check = Command::new("bash")
        .arg("-n")
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(bash.as_bytes())?;
            child.wait_with_output()
        })
        .expect("bash -n");
    assert!(
        check.status.success(),
        "the bash completion does not parse: {}",
        String::from_utf8_lossy(&check.stderr)
    );

    let man = stdout_of(&["man"]);
    assert!(
        man.starts_with(".ie") || man.contains(".TH socklb 8"),
        "{man}"
    );
    for subcommand in SUBCOMMANDS {
        assert!(
            man.contains(&format!(".SH \"SOCKLB {}\"", subcommand.to_uppercase())),
            "the man page has no section for socklb {subcommand}"
        );
    }
    for flag in ["socket\\-destroy\\-mode", "bpffs", "count"] {
        assert!(man.contains(flag), "the man page lacks --{flag}");
    }
}

/// The README's first commands are `./x TASK`, no `sudo`: they work on a root-only machine
/// (a container, a CI runner). From another user, `./x` runs itself again through sudo
/// when there is one, and says to run it as root when there is none.
#[test]
fn the_readme_commands_work_as_root_and_through_sudo() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let block = readme
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a sh block in the README");
    let commands: Vec<&str> = block
        .lines()
        .map(|line| line.split('#').next().unwrap_or("").trim())
        .filter(|line| !line.is_empty())
        .collect();
    assert_eq!(
        commands,
        ["./x demo", "./x test"],
        "the README's first screen shows the two commands, without sudo"
    );

    let scratch = std::env::temp_dir().join(format!("socklb-readme-{}", std::process::id()));
    let _remove = RemoveDir(scratch.clone());
    let fake_bin = scratch.join("bin");
    std::fs::create_dir_all(&fake_bin).expect("scratch dir");
    // Other users need to reach the fake sudo.
    for dir in [&scratch, &fake_bin] {
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
    }
    let fake_sudo = fake_bin.join("sudo");
    std::fs::write(&fake_sudo, "#!/bin/sh\necho \"sudo $*\"\n").expect("fake sudo");
    std::fs::set_permissions(
        &fake_sudo,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let x = root.join("x");
    let as_nobody = |path: &str, task: &str| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&x)
            .arg(task)
            .env_clear()
            .env("PATH", path)
            .env("HOME", &scratch)
            .stdin(Stdio::null())
            .output()
            .expect("run ./x as nobody")
    };
    let system_path = "/usr/local/bin:/usr/bin:/bin";
    for command in commands {
        let task = command.strip_prefix("./x ").expect("./x TASK");
        let through_sudo = as_nobody(&format!("{}:{system_path}", fake_bin.display()), task);
        assert_eq!(
            String::from_utf8_lossy(&through_sudo.stdout).trim(),
            format!("sudo {} {task}", x.display()),
            "as a user, `{command}` must run itself again through sudo: {}",
            String::from_utf8_lossy(&through_sudo.stderr)
        );
        let without_sudo = as_nobody(system_path, task);
        let said = String::from_utf8_lossy(&without_sudo.stderr);
        assert!(
            !without_sudo.status.success() && said.contains("run it as root"),
            "as a user without sudo, `{command}` must say to run it as root: {said}"
        );
    }
}

struct RemoveDir(std::path::PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
