//! `vmfabric run --universe-size` and spawn requests through the real binary: the rank is `bash` (dash
//! takes no descriptor above 9 in redirections), speaking PMI-1 on `PMI_FD` line by line and sending the
//! multi-line `mcmd=spawn` request the way MPICH's PMI_Spawn_multiple writes it; its children are `bash`
//! too.
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_vmfabric")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vmf-spawn-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The rank program: as a spawned child it reports its appnum, size and the parent's port; as the
/// parent it reports the universe size and spawns `bash -c "$SCRIPT"` twice (2 commands, 1 process each,
/// the second with an info wdir).
const SCRIPT: &str = r#"
f=$PMI_FD
ask() { printf '%s\n' "$1" >&$f; read -r r <&$f; echo "$r"; }
ask "cmd=init pmi_version=1 pmi_subversion=1" >/dev/null
if [ "$PMI_SPAWNED" = 1 ]; then
    ask "cmd=get_appnum"
    ask "cmd=get kvsname=$PMI_JOBID key=PARENT_ROOT_PORT_NAME"
    echo "child size=$PMI_SIZE rank=$PMI_RANK job=$VMF_JOB_ID cwd=$(pwd)"
    ask "cmd=finalize" >/dev/null
    exit 0
fi
ask "cmd=get_universe_size"
block() {
    printf 'mcmd=spawn\nnprocs=1\nexecname=bash\ntotspawns=2\nspawnssofar=%s\narg1=-c\narg2=eval "$SCRIPT"\nargcnt=2\npreput_num=1\npreput_key_0=PARENT_ROOT_PORT_NAME\npreput_val_0=tag#0$port#4242$\ninfo_num=%s\n%sendcmd\n' "$1" "$2" "$3"
}
{ block 1 0 ""; block 2 1 "info_key_0=wdir
info_val_0=$WD
"; } >&$f
read -r r <&$f; echo "$r"
ask "cmd=finalize" >/dev/null
"#;

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    // One region directory per call: the tests run in parallel.
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let k = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = tmp(&format!("regions{k}"));
    let mut c = Command::new(bin());
    c.arg("run")
        .arg("--region-dir")
        .arg(&d)
        .args(args)
        .env("SCRIPT", SCRIPT)
        .env_remove("VMF_UNIVERSE_SIZE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.spawn().unwrap();
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("vmfabric run {args:?} took more than 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = child.wait_with_output().unwrap();
    let _ = std::fs::remove_dir_all(&d);
    o
}

#[test]
fn universe_size_and_spawn_through_the_cli_works() {
    let wd = tmp("wd");
    let wd_s = wd.to_string_lossy().into_owned();
    let o = run(
        &[
            "-n",
            "1",
            "--universe-size",
            "7",
            "--tag-output",
            "bash",
            "-c",
            "eval \"$SCRIPT\"",
        ],
        &[("WD", &wd_s)],
    );
    let (so, se) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(o.status.code(), Some(0), "stdout:\n{so}\nstderr:\n{se}");
    let has = |l: &str| so.lines().any(|x| x == l);
    assert!(has("[0] cmd=universe_size rc=0 size=7"), "{so}");
    assert!(has("[0] cmd=spawn_result rc=0"), "{so}");
    for k in 0..2 {
        assert!(has(&format!("[s1.{k}] cmd=appnum rc=0 appnum={k}")), "{so}");
        assert!(
            has(&format!(
                "[s1.{k}] cmd=get_result rc=0 msg=success value=tag#0$port#4242$"
            )),
            "{so}"
        );
    }
    let child = |k: usize| {
        so.lines()
            .find(|l| l.starts_with(&format!("[s1.{k}] child ")))
            .unwrap_or_else(|| panic!("{so}"))
            .to_string()
    };
    assert!(child(0).contains(" size=2 rank=0 job="), "{so}");
    assert!(child(1).contains(" size=2 rank=1 job="), "{so}");
    assert!(
        child(1).ends_with(&format!("cwd={}", wd.canonicalize().unwrap().display())),
        "{so}"
    );
    std::fs::remove_dir_all(&wd).unwrap();
}

#[test]
fn bad_universe_size_fails() {
    let o = run(&["-n", "2", "--universe-size", "1", "true"], &[]);
    let se = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{se}");
    assert!(
        se.contains("Unable to start the job since the universe size 1 is not within 2..="),
        "{se}"
    );
    let o = run(&["-n", "1", "true"], &[("VMF_UNIVERSE_SIZE", "lots")]);
    let se = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{se}");
    assert!(
        se.contains("VMF_UNIVERSE_SIZE=lots is not a number"),
        "{se}"
    );
    // The environment variable is the default of the flag.
    let o = run(
        &[
            "-n",
            "1",
            "bash",
            "-c",
            "printf 'cmd=get_universe_size\\n' >&$PMI_FD; read -r r <&$PMI_FD; echo \"$r\"",
        ],
        &[("VMF_UNIVERSE_SIZE", "9")],
    );
    let so = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0));
    assert!(so.contains("cmd=universe_size rc=0 size=9"), "{so}");
}
