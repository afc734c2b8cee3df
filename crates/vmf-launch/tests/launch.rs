//! End-to-end tests of the launcher: ranks are small `sh` scripts, or this very test binary re-executed in
//! a helper role (a PMI client, or a launcher whose output the test captures).
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use vmf_launch::{clean, run, LaunchError, RunOptions};
use vmf_pal::process::ProcessId;
use vmf_pmi::PmiClient;
use vmf_transport::shm::region::{region_file_name, Region, RegionSizing, RegionSource};

/// A fresh, empty directory for one test.
fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vmf-launch-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn sh(np: usize, script: &str, dir: &Path) -> RunOptions {
    let mut o = RunOptions::new(np, "sh", vec!["-c".into(), script.into()]);
    o.region_dir = dir.join("regions");
    o
}

/// Options that run this test binary as rank in helper role `role`.
fn helper(np: usize, role: &str, dir: &Path) -> RunOptions {
    let exe = std::env::current_exe()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let args = [
        "helper_role",
        "--exact",
        "--nocapture",
        "--test-threads=1",
        "-q",
    ];
    let mut o = RunOptions::new(np, exe, args.iter().map(|s| s.to_string()).collect());
    o.region_dir = dir.join("regions");
    o.extra_env.push(("VMF_TEST_ROLE".into(), role.into()));
    o
}

/// Not a test: the entry point of helper processes (does nothing when run as part of the suite).
#[test]
fn helper_role() {
    let Ok(role) = std::env::var("VMF_TEST_ROLE") else {
        return;
    };
    let code = match role.as_str() {
        "launcher" => launcher_role(),
        r => match pmi_role(r) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("helper {r}: {e}");
                99
            }
        },
    };
    std::process::exit(code);
}

fn pmi_role(role: &str) -> Result<i32, vmf_pmi::PmiError> {
    let mut pmi = PmiClient::from_env()?.expect("PMI_FD is set by the launcher");
    let (me, n) = (pmi.rank(), pmi.size());
    assert_eq!(
        pmi.kvsname(),
        format!("vmf-{}", std::env::var("VMF_JOB_ID").unwrap())
    );
    match role {
        "pmi_ring" => {
            for round in 0..3 {
                pmi.put(&format!("r{round}-{me}"), &format!("v{round}-{me}"))?;
                pmi.fence()?;
                for r in 0..n {
                    if pmi.get(&format!("r{round}-{r}"))? != format!("v{round}-{r}") {
                        return Ok(3);
                    }
                }
            }
            // No --universe-size: not known.
            if pmi.universe_size()?.is_some() {
                return Ok(4);
            }
            pmi.finalize()?;
            Ok(0)
        }
        "pmi_abort" => {
            if me == 1 {
                pmi.abort(7, "test abort")?;
            }
            std::thread::sleep(Duration::from_secs(30));
            Ok(0)
        }
        "pmi_nofinalize" => {
            if me != 1 {
                std::thread::sleep(Duration::from_secs(30));
            }
            Ok(0)
        }
        "pmi_close" => {
            // Every rank closes its PMI connection without finalize, and lives on.
            drop(pmi);
            std::thread::sleep(Duration::from_secs(30));
            Ok(0)
        }
        _ => Ok(98),
    }
}

fn launcher_role() -> i32 {
    let e = |k: &str| std::env::var(k).unwrap_or_default();
    let mut o = RunOptions::new(
        e("VMF_TEST_NP").parse().unwrap(),
        "sh",
        vec!["-c".into(), e("VMF_TEST_SCRIPT")],
    );
    o.region_dir = PathBuf::from(e("VMF_TEST_DIR"));
    o.tag_output = e("VMF_TEST_TAG") == "1";
    o.verbose = true;
    match run(&o) {
        Ok(c) => c,
        Err(err) => {
            eprintln!("vmfabric: {err}");
            1
        }
    }
}

/// Start this binary as a launcher running `np` copies of `sh -c script`.
fn launcher_cmd(np: usize, script: &str, tag: bool, dir: &Path) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "helper_role",
        "--exact",
        "--nocapture",
        "--test-threads=1",
        "-q",
    ])
    .env("VMF_TEST_ROLE", "launcher")
    .env("VMF_TEST_NP", np.to_string())
    .env("VMF_TEST_SCRIPT", script)
    .env("VMF_TEST_DIR", dir.join("regions"))
    .env("VMF_TEST_TAG", if tag { "1" } else { "0" })
    .env("OUT", dir)
    .stdin(Stdio::null());
    c
}

fn wait_for_files(files: &[PathBuf], timeout: Duration) {
    let t = Instant::now();
    while !files
        .iter()
        .all(|f| std::fs::read_to_string(f).is_ok_and(|s| s.ends_with('\n')))
    {
        assert!(t.elapsed() < timeout, "ranks did not start: {files:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn pid_in(f: &Path) -> i32 {
    std::fs::read_to_string(f).unwrap().trim().parse().unwrap()
}

fn assert_dead_soon(pid: i32) {
    let t = Instant::now();
    while (ProcessId { pid, start_time: 0 }).is_alive() {
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "rank pid {pid} survived"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn all_ranks_exit_zero_works() {
    let d = tmp("zero");
    let o = sh(3, r#"[ "$PMI_RANK" = 0 ] && exit 0; sleep 0.3; exit 0"#, &d);
    assert_eq!(run(&o).unwrap(), 0);
    std::fs::remove_dir_all(&d).unwrap();
}

/// Run `np` ranks that each check whether they lead their session (field 6 of /proc/self/stat is the
/// session id; a rank that called setsid leads its own) and fail unless that is `leads`.
fn check_session_leaders(np: usize, leads: bool) {
    let d = tmp(if leads { "session" } else { "session-over" });
    let test = if leads { "=" } else { "!=" };
    let script = format!(
        r#"s=$(cut -d' ' -f6 /proc/$$/stat); [ "$s" {test} "$$" ] || {{ echo "rank $PMI_RANK: session $s, pid $$" >&2; exit 7; }}"#
    );
    assert_eq!(run(&sh(np, &script, &d)).unwrap(), 0);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn oversubscribed_ranks_share_the_launchers_session_works() {
    // More ranks than CPUs: they stay in the launcher's session (one autogroup).
    check_session_leaders(vmf_pal::process::allowed_cpus().len() + 1, false);
}

#[test]
fn each_rank_leads_its_own_session_works() {
    check_session_leaders(vmf_pal::process::allowed_cpus().len().min(2), true);
}

#[test]
fn exit_code_propagates_and_stops_job_fails() {
    let d = tmp("exit3");
    let o = sh(
        3,
        r#"if [ "$PMI_RANK" = 1 ]; then sleep 0.2; exit 3; fi; exec sleep 30"#,
        &d,
    );
    let t = Instant::now();
    assert_eq!(run(&o).unwrap(), 3);
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "took {:?}",
        t.elapsed()
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn rank_killed_by_signal_gives_128_plus_signal_fails() {
    let d = tmp("sig");
    let o = sh(
        2,
        r#"if [ "$PMI_RANK" = 1 ]; then kill -9 $$; fi; exec sleep 30"#,
        &d,
    );
    let t = Instant::now();
    assert_eq!(run(&o).unwrap(), 137);
    assert!(t.elapsed() < Duration::from_secs(2));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn rank_ignoring_sigterm_is_killed_works() {
    let d = tmp("ignterm");
    // Rank 0 ignores SIGTERM (sh traps it) and keeps its children; SIGKILL follows after the grace.
    let o = sh(
        2,
        r#"if [ "$PMI_RANK" = 1 ]; then exit 5; fi; trap '' TERM; while :; do sleep 0.05; done"#,
        &d,
    );
    let t = Instant::now();
    assert_eq!(run(&o).unwrap(), 5);
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "took {:?}",
        t.elapsed()
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn environment_is_set_works() {
    let d = tmp("env");
    let mut o = sh(
        2,
        r#"echo "$PMI_RANK $PMI_SIZE $PMI_FD $VMF_JOB_ID $VMF_LAUNCHER_PID $VMF_LAUNCHER_START $VMF_REGION_DIR $VMF_LOCAL_SIZE $MPI_LOCALNRANKS $MPI_LOCALRANKID $PMI_JOBID $EXTRA" > "$OUT/env-$PMI_RANK"
           [ -S /proc/self/fd/$PMI_FD ] || [ -e /proc/self/fd/$PMI_FD ] || exit 9"#,
        &d,
    );
    o.extra_env = vec![
        ("OUT".into(), d.to_string_lossy().into()),
        ("EXTRA".into(), "extra-value".into()),
    ];
    assert_eq!(run(&o).unwrap(), 0);
    let me = ProcessId::current();
    for r in 0..2 {
        let s = std::fs::read_to_string(d.join(format!("env-{r}"))).unwrap();
        let f: Vec<&str> = s.split_whitespace().collect();
        assert_eq!(f.len(), 12, "{s}");
        assert_eq!(f[0], r.to_string());
        assert_eq!(f[1], "2");
        assert!(f[2].parse::<i32>().unwrap() >= 3);
        assert_eq!(f[3].len(), 12);
        assert!(f[3].chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(f[4], me.pid.to_string());
        assert_eq!(f[5], me.start_time.to_string());
        assert_eq!(f[6], o.region_dir.to_string_lossy());
        assert_eq!((f[7], f[8], f[9]), ("2", "2", r.to_string().as_str()));
        assert_eq!(f[10], format!("vmf-{}", f[3]));
        assert_eq!(f[11], "extra-value");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn region_files_are_removed_at_end_works() {
    for (script, code) in [("exit 0", 0), ("exit 4", 4)] {
        let d = tmp(&format!("regions-{code}"));
        let mut o = sh(
            2,
            &format!(
                r#"if [ "$PMI_RANK" = 0 ]; then touch "$VMF_REGION_DIR/vmf-$VMF_JOB_ID.shm" "$VMF_REGION_DIR/vmf-$VMF_JOB_ID.lock"; echo "$VMF_JOB_ID" > "$OUT/job"; {script}; fi; exec sleep 30"#
            ),
            &d,
        );
        o.extra_env = vec![("OUT".into(), d.to_string_lossy().into())];
        let keep = o.region_dir.join("unrelated-file");
        std::fs::create_dir_all(&o.region_dir).unwrap();
        std::fs::write(&keep, b"x").unwrap();
        // Exit 0 of rank 0 is normal while rank 1 runs: stop rank 1 ourselves from the test in that case.
        let res = if code == 0 {
            let mut o2 = o.clone();
            o2.args[1] = o.args[1].replace("exec sleep 30", "sleep 0.3");
            run(&o2).unwrap()
        } else {
            run(&o).unwrap()
        };
        assert_eq!(res, code);
        let job = std::fs::read_to_string(d.join("job")).unwrap();
        let job = job.trim();
        assert!(!o.region_dir.join(region_file_name(job)).exists());
        assert!(!o.region_dir.join(format!("vmf-{job}.lock")).exists());
        assert!(keep.exists(), "other files are left alone");
        std::fs::remove_dir_all(&d).unwrap();
    }
}

fn make_region(dir: &Path, job: &str, launcher: ProcessId, age: Duration) -> PathBuf {
    let sizing = RegionSizing {
        max_local: 2,
        heap: 64 * 1024,
        pool_per_slot: 0,
    };
    drop(
        Region::open(
            &RegionSource::Dir(dir.to_path_buf()),
            job,
            sizing,
            Some(launcher),
            Duration::from_secs(2),
        )
        .unwrap(),
    );
    let p = dir.join(region_file_name(job));
    let f = std::fs::File::options().write(true).open(&p).unwrap();
    f.set_modified(std::time::SystemTime::now() - age).unwrap();
    p
}

#[test]
fn clean_removes_only_dead_jobs_works() {
    let d = tmp("clean");
    let dead = ProcessId {
        pid: i32::MAX - 7,
        start_time: 1,
    };
    let old = Duration::from_secs(60);
    let stale = make_region(&d, "deadjob00001", dead, old);
    let live = make_region(&d, "livejob00001", ProcessId::current(), old);
    // A recorded launcher that is dead is conclusive, however young the file.
    let young = make_region(&d, "youngdead001", dead, Duration::ZERO);
    let mut removed = clean(&d);
    removed.sort();
    let mut want = vec![stale.clone(), young.clone()];
    want.sort();
    assert_eq!(removed, want);
    assert!(!stale.exists() && !young.exists());
    assert!(live.exists());
    assert!(clean(&d.join("missing")).is_empty());
    // run() cleans the region directory before starting.
    let stale2 = make_region(&d, "deadjob00002", dead, old);
    let mut o = sh(1, "exit 0", &d);
    o.region_dir = d.clone();
    assert_eq!(run(&o).unwrap(), 0);
    assert!(!stale2.exists());
    assert!(live.exists());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn bad_program_and_region_dir_fail() {
    let d = tmp("bad");
    let mut o = RunOptions::new(2, "/nonexistent/vmf-no-such-program", vec![]);
    o.region_dir = d.join("new/nested");
    let e = run(&o).unwrap_err();
    assert!(matches!(e, LaunchError::Spawn { rank: 0, .. }), "{e:?}");
    assert!(
        e.to_string()
            .starts_with("Unable to start rank 0 (/nonexistent/vmf-no-such-program) since"),
        "{e}"
    );
    assert!(!e.to_string().contains('\n'));
    // A missing region directory is made for the job, private, and removed with the parents made for it
    // when the job ends (also when it could not start).
    assert!(!d.join("new").exists());
    let mut o = sh(1, "stat -c %a \"$VMF_REGION_DIR\" > \"$OUT\"", &d);
    o.region_dir = d.join("new/nested");
    o.extra_env.push(("OUT".into(), d.join("mode").to_string_lossy().into_owned()));
    assert_eq!(run(&o).unwrap(), 0);
    assert_eq!(std::fs::read_to_string(d.join("mode")).unwrap().trim(), "700");
    assert!(!d.join("new").exists());
    let file = d.join("a-file");
    std::fs::write(&file, b"").unwrap();
    let mut o = sh(1, "exit 0", &d);
    o.region_dir = file;
    let e = run(&o).unwrap_err();
    assert!(matches!(e, LaunchError::RegionDir { .. }), "{e:?}");
    assert!(e
        .to_string()
        .starts_with("Unable to use the region directory"));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn pmi_ring_through_launcher_works() {
    let d = tmp("ring");
    assert_eq!(run(&helper(4, "pmi_ring", &d)).unwrap(), 0);
    std::fs::remove_dir_all(&d).unwrap();
}

/// Run `n` ranks of helper role `role`: the job must end within 5 s with exit status `code`.
fn job_ends_quickly_with(name: &str, n: usize, role: &str, code: i32) {
    let d = tmp(name);
    let t = Instant::now();
    assert_eq!(run(&helper(n, role, &d)).unwrap(), code);
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn pmi_abort_stops_job_fails() {
    job_ends_quickly_with("abort", 3, "pmi_abort", 7);
}

/// A rank that returns from main without MPI_Finalize stops the job, with status 0 as under Hydra
/// (`mpiexec.mpich`); OSU 7.4's osu_latency_mt does that once its results are printed.
#[test]
fn exit_zero_without_finalize_stops_job_like_hydra_works() {
    job_ends_quickly_with("nofin", 2, "pmi_nofinalize", 0);
}

/// A rank that closes its PMI connection without finalize and goes on running is a failure.
#[test]
fn pmi_disconnect_without_finalize_stops_job_fails() {
    job_ends_quickly_with("pmiclose", 2, "pmi_close", 1);
}

#[test]
fn tagged_output_is_forwarded_works() {
    let d = tmp("tag");
    let script =
        r#"echo "hello $PMI_RANK"; printf 'no-newline-%s' "$PMI_RANK"; echo "err $PMI_RANK" >&2"#;
    let out = launcher_cmd(2, script, true, &d).output().unwrap();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "stdout:\n{so}\nstderr:\n{se}");
    for r in 0..2 {
        assert!(so.lines().any(|l| l == format!("[{r}] hello {r}")), "{so}");
        assert!(so.contains(&format!("[{r}] no-newline-{r}")), "{so}");
        assert!(se.lines().any(|l| l == format!("[{r}] err {r}")), "{se}");
    }
    // The job id is always printed first; --verbose adds the region directory.
    assert!(
        se.lines()
            .any(|l| l.starts_with("vmfabric: job ") && l.ends_with(": 2 ranks")),
        "{se}"
    );
    assert!(se.lines().any(|l| l.contains(": region dir ")), "{se}");
    // Untagged: bytes unchanged.
    let out = launcher_cmd(1, r#"printf 'a\nb\n[x] c'"#, false, &d)
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(so.contains("a\nb\n[x] c"), "{so}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn failure_message_is_one_line_works() {
    let d = tmp("msg");
    let out = launcher_cmd(
        2,
        r#"[ "$PMI_RANK" = 1 ] && exit 3; exec sleep 30"#,
        false,
        &d,
    )
    .output()
    .unwrap();
    let se = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{se}");
    let lines: Vec<_> = se
        .lines()
        .filter(|l| l.contains("stopping the job"))
        .collect();
    assert_eq!(lines.len(), 1, "{se}");
    assert!(
        lines[0].starts_with("vmfabric: rank 1 (pid ")
            && lines[0].ends_with(") exited with code 3; stopping the job"),
        "{se}"
    );
    let out = launcher_cmd(1, "kill -SEGV $$", false, &d)
        .output()
        .unwrap();
    let se = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + 11), "{se}");
    assert!(
        se.contains("was killed by signal 11 (SIGSEGV); stopping the job"),
        "{se}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn launcher_signal_stops_ranks_works() {
    let d = tmp("sigterm");
    let mut child = launcher_cmd(
        2,
        r#"echo $$ > "$OUT/pid-$PMI_RANK"; exec sleep 30"#,
        false,
        &d,
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let pids = [d.join("pid-0"), d.join("pid-1")];
    wait_for_files(&pids, Duration::from_secs(10));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    let st = child.wait().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(st.code(), Some(128 + 15));
    for p in &pids {
        assert_dead_soon(pid_in(p));
    }
    let mut se = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut se).unwrap();
    assert!(
        se.contains("received signal 15 (SIGTERM); stopping the job"),
        "{se}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn ranks_die_with_killed_launcher_works() {
    let d = tmp("kill9");
    let mut child = launcher_cmd(
        2,
        r#"echo $$ > "$OUT/pid-$PMI_RANK"; exec sleep 30"#,
        false,
        &d,
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let pids = [d.join("pid-0"), d.join("pid-1")];
    wait_for_files(&pids, Duration::from_secs(10));
    child.kill().unwrap();
    child.wait().unwrap();
    for p in &pids {
        assert_dead_soon(pid_in(p));
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn more_ranks_on_a_host_than_region_slots_fail_before_starting() {
    let d = tmp("slots");
    let mut o = sh(300, "exit 0", &d);
    let e = run(&o).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Unable to start the job since 300 ranks on this host exceed the 256 ranks one shared region holds \
         (VMF_SHM_MAX_LOCAL); raise VMF_SHM_MAX_LOCAL or spread the ranks over more hosts (--hosts)"
    );
    // Nothing was started or made.
    assert!(!d.join("regions").exists());
    o.np = 3;
    o.extra_env.push(("VMF_SHM_MAX_LOCAL".into(), "2".into()));
    assert!(run(&o).unwrap_err().to_string().contains("3 ranks on this host exceed the 2 ranks"));
    o.extra_env.push(("VMF_SHM_MAX_LOCAL".into(), "3".into()));
    assert_eq!(run(&o).unwrap(), 0);
    std::fs::remove_dir_all(&d).unwrap();
}
