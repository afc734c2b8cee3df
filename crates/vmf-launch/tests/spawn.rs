//! Spawn requests through the launcher (MPI_Comm_spawn over PMI-1): this test binary, re-executed, is the
//! parent rank (it sends the request with `PmiClient::spawn`) and the spawned children (which check what
//! they were given and report it in a file); another copy of it is the launcher, so the tests can read its
//! output.
//!
//! The parent tells its children what to do through preputs (children inherit only the launcher's
//! environment): `vmf-test-plan` (ok, fail-exit3, fail-kill, abort5, sleep, grandparent) and
//! `PARENT_ROOT_PORT_NAME`.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use vmf_pal::process::ProcessId;
use vmf_pmi::{PmiClient, PmiError, SpawnCmd};

const HELPER_ARGS: [&str; 5] = [
    "spawn_helper_role",
    "--exact",
    "--nocapture",
    "--test-threads=1",
    "-q",
];

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vmf-spawn-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn helper_args() -> Vec<String> {
    HELPER_ARGS.iter().map(|s| s.to_string()).collect()
}

fn me() -> String {
    std::env::current_exe()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// Not a test: the entry point of helper processes (does nothing when run as part of the suite).
#[test]
fn spawn_helper_role() {
    let Ok(role) = std::env::var("VMF_TEST_ROLE") else {
        return;
    };
    let code = if role == "launcher" {
        launcher_role()
    } else {
        let res = if std::env::var("PMI_SPAWNED").is_ok() {
            child_role()
        } else {
            parent_role(&role)
        };
        res.unwrap_or_else(|e| {
            eprintln!("helper {role}: {e}");
            99
        })
    };
    std::process::exit(code);
}

/// The launcher: `np` ranks of this binary in role `VMF_TEST_INNER`.
fn launcher_role() -> i32 {
    let e = |k: &str| std::env::var(k).unwrap_or_default();
    let mut o = vmf_launch::RunOptions::new(e("VMF_TEST_NP").parse().unwrap(), me(), helper_args());
    o.region_dir = PathBuf::from(e("VMF_TEST_DIR"));
    o.tag_output = true;
    o.verbose = e("VMF_TEST_VERBOSE") == "1";
    o.universe_size = e("VMF_TEST_UNIVERSE").parse().ok().filter(|&u| u > 0);
    o.extra_env
        .push(("VMF_TEST_ROLE".into(), e("VMF_TEST_INNER")));
    match vmf_launch::run(&o) {
        Ok(c) => c,
        Err(err) => {
            eprintln!("vmfabric: {err}");
            1
        }
    }
}

fn cmd(n: usize, info: &[(&str, &str)]) -> SpawnCmd {
    SpawnCmd {
        exe: me(),
        args: helper_args(),
        maxprocs: n,
        info: info
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

fn preput(plan: &str) -> Vec<(String, String)> {
    let job = std::env::var("VMF_JOB_ID").unwrap();
    vec![
        ("PARENT_ROOT_PORT_NAME".into(), format!("port-of-{job}")),
        ("vmf-test-plan".into(), plan.into()),
    ]
}

fn out_dir() -> PathBuf {
    PathBuf::from(std::env::var("OUT").unwrap())
}

fn parent_role(role: &str) -> Result<i32, PmiError> {
    let mut pmi = PmiClient::from_env()?.expect("PMI_FD is set by the launcher");
    assert!(!pmi.spawned());
    assert_eq!(pmi.appnum(), 0);
    let want_universe: usize = std::env::var("VMF_TEST_EXPECT_UNIVERSE")
        .unwrap()
        .parse()
        .unwrap();
    if pmi.universe_size()? != (want_universe > 0).then_some(want_universe) {
        eprintln!("parent: universe size {:?}", pmi.universe_size()?);
        return Ok(4);
    }
    let out = out_dir();
    let code = match role {
        "parent_ok" => {
            // MPI_Comm_spawn: 2 copies in the test directory (info wdir), one of which spawns again.
            let wdir = out.join("wd");
            std::fs::create_dir_all(&wdir).unwrap();
            pmi.spawn(
                &[cmd(
                    2,
                    &[("wdir", wdir.to_str().unwrap()), ("color", "blue")],
                )],
                &preput("grandparent"),
            )?;
            // MPI_Comm_spawn_multiple: two commands, 1 process each (appnum 0 and 1), on this machine.
            pmi.spawn(
                &[cmd(1, &[("host", "localhost")]), cmd(1, &[])],
                &preput("ok"),
            )?;
            0
        }
        "parent_refused" => {
            // Requests the launcher refuses; the job goes on.
            let mut bad = cmd(1, &[]);
            bad.exe = "/nonexistent/vmf-no-such-program".into();
            let e1 = pmi.spawn(&[bad], &preput("ok")).unwrap_err().to_string();
            let e2 = pmi
                .spawn(&[cmd(1, &[("host", "far-away-node")])], &preput("ok"))
                .unwrap_err()
                .to_string();
            let e3 = pmi
                .spawn(&[cmd(5000, &[])], &preput("ok"))
                .unwrap_err()
                .to_string();
            std::fs::write(out.join("refused"), format!("{e1}\n{e2}\n{e3}\n")).unwrap();
            // Still able to spawn afterwards.
            pmi.spawn(&[cmd(1, &[])], &preput("ok"))?;
            0
        }
        p => {
            // Children that fail, abort or sleep: the parent waits to be stopped.
            let plan = p.strip_prefix("parent_").unwrap();
            pmi.spawn(&[cmd(2, &[])], &preput(plan))?;
            std::thread::sleep(Duration::from_secs(30));
            0
        }
    };
    pmi.finalize()?;
    Ok(code)
}

fn child_role() -> Result<i32, PmiError> {
    let mut pmi = PmiClient::from_env()?.expect("PMI_FD is set by the launcher");
    let (rank, size, appnum) = (pmi.rank(), pmi.size(), pmi.appnum());
    let job = std::env::var("VMF_JOB_ID").unwrap();
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    // No fence: the preputs are there from the start.
    let port = pmi.get("PARENT_ROOT_PORT_NAME")?;
    let plan = pmi.get("vmf-test-plan")?;
    // The child job's own key-value space and barrier.
    pmi.put(&format!("c{rank}"), &format!("v{rank}"))?;
    pmi.fence()?;
    for r in 0..size {
        if pmi.get(&format!("c{r}"))? != format!("v{r}") {
            return Ok(5);
        }
    }
    // A region file like the fabric's, to see it removed at the end.
    let dir = PathBuf::from(env("VMF_REGION_DIR"));
    std::fs::write(dir.join(format!("vmf-{job}.shm")), b"x").unwrap();
    let universe = pmi.universe_size()?.map_or(-1, |u| u as i64);
    let report = format!(
        "job={job} rank={rank} size={size} appnum={appnum} spawned={} env_spawned={} port={port} \
         kvsname={} pmi_jobid={} universe={} launcher={} local={},{} cwd={} ld_first={} ctl={}",
        pmi.spawned(),
        env("PMI_SPAWNED"),
        pmi.kvsname(),
        env("PMI_JOBID"),
        universe,
        env("VMF_LAUNCHER_PID"),
        env("MPI_LOCALNRANKS"),
        env("MPI_LOCALRANKID"),
        std::env::current_dir().unwrap().display(),
        env("LD_LIBRARY_PATH").split(':').next().unwrap_or(""),
        env("VMF_CTL_FD").is_empty(),
    );
    println!("child {rank} of {job} says hello");
    match plan.as_str() {
        "grandparent" if rank == 0 => {
            // A spawned process spawns too.
            pmi.spawn(&[cmd(1, &[])], &preput("ok"))?;
        }
        "fail-exit3" if rank == 1 => {
            std::thread::sleep(Duration::from_millis(200));
            std::process::exit(3)
        }
        "fail-kill" if rank == 1 => {
            std::thread::sleep(Duration::from_millis(200));
            // SAFETY: signalling ourselves.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        "abort5" if rank == 0 => {
            pmi.abort(5, "child gives up")?;
            std::thread::sleep(Duration::from_secs(30));
        }
        "sleep" | "fail-exit3" | "fail-kill" | "abort5" => {
            std::fs::write(
                out_dir().join(format!("pid-{job}-{rank}")),
                format!("{}\n", std::process::id()),
            )
            .unwrap();
            std::thread::sleep(Duration::from_secs(30));
        }
        _ => {}
    }
    std::fs::write(out_dir().join(format!("child-{job}-{rank}")), report).unwrap();
    pmi.finalize()?;
    Ok(0)
}

/// Run the launcher (this binary) with `np` ranks in role `inner`; universe size `universe` (0: default)
/// and the universe size the parent must see.
fn launch(d: &Path, np: usize, inner: &str, universe: usize, expect: usize) -> Command {
    let mut c = Command::new(me());
    c.args(HELPER_ARGS)
        .env("VMF_TEST_ROLE", "launcher")
        .env("VMF_TEST_INNER", inner)
        .env("VMF_TEST_NP", np.to_string())
        .env("VMF_TEST_DIR", d.join("regions"))
        .env("VMF_TEST_UNIVERSE", universe.to_string())
        .env("VMF_TEST_EXPECT_UNIVERSE", expect.to_string())
        .env("VMF_TEST_VERBOSE", "1")
        .env("OUT", d)
        .env_remove("PMI_SPAWNED")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn run_to_end(mut c: Command, limit: Duration) -> (Output, String, String) {
    let t = Instant::now();
    let mut child = c.spawn().unwrap();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > limit {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!(
                "the job took more than {limit:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = child.wait_with_output().unwrap();
    let so = String::from_utf8_lossy(&o.stdout).into_owned();
    let se = String::from_utf8_lossy(&o.stderr).into_owned();
    (o, so, se)
}

/// The children's reports: file name -> key -> value.
fn reports(d: &Path) -> BTreeMap<String, BTreeMap<String, String>> {
    std::fs::read_dir(d)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("child-"))
        .map(|e| {
            let text = std::fs::read_to_string(e.path()).unwrap();
            let kv = text
                .split_whitespace()
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            (e.file_name().to_string_lossy().into_owned(), kv)
        })
        .collect()
}

fn job_of(se: &str) -> String {
    let l = se
        .lines()
        .find(|l| l.starts_with("vmfabric: job ") && l.ends_with(" ranks"))
        .unwrap_or_else(|| panic!("no job line: {se}"));
    l["vmfabric: job ".len()..]
        .split(':')
        .next()
        .unwrap()
        .to_string()
}

fn region_leftovers(d: &Path, job: &str) -> Vec<String> {
    std::fs::read_dir(d.join("regions"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("vmf-{job}")))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn spawned_children_run_as_new_jobs_works() {
    let d = tmp("ok");
    let (o, so, se) = run_to_end(launch(&d, 1, "parent_ok", 6, 6), Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(0), "stdout:\n{so}\nstderr:\n{se}");
    let job = job_of(&se);
    let r = reports(&d);
    let names: Vec<&str> = r.keys().map(String::as_str).collect();
    // s1: the two children of MPI_Comm_spawn; s2: the spawn_multiple pair; s3: the grandchild (s1 rank 0
    // asked before s2 existed, or after: the numbering follows arrival).
    assert_eq!(names.len(), 5, "{names:?}\nstderr:\n{se}");
    let by_job = |k: &str| -> Vec<&BTreeMap<String, String>> {
        r.values()
            .filter(|v| v["job"] == format!("{job}-{k}"))
            .collect()
    };
    let (s1, s2, s3) = (by_job("s1"), by_job("s2"), by_job("s3"));
    let (pair, multi, grand) = if s1.len() == 2 && s2.len() == 2 {
        (s1, s2, s3)
    } else if s1.len() == 2 && s3.len() == 2 {
        (s1, s3, s2)
    } else {
        panic!("unexpected jobs: {r:?}");
    };
    assert_eq!(grand.len(), 1, "{r:?}");
    let launcher = {
        // The launcher is the child process of this test: every report names the same one.
        let l = &pair[0]["launcher"];
        assert!(r.values().all(|v| &v["launcher"] == l), "{r:?}");
        l.clone()
    };
    assert!(!launcher.is_empty());
    for (group, size) in [(&pair, 2), (&multi, 2), (&grand, 1)] {
        let mut ranks: Vec<String> = group.iter().map(|v| v["rank"].clone()).collect();
        ranks.sort();
        assert_eq!(ranks, (0..size).map(|i| i.to_string()).collect::<Vec<_>>());
        for v in group.iter() {
            assert_eq!(v["size"], size.to_string(), "{v:?}");
            assert_eq!(
                (v["spawned"].as_str(), v["env_spawned"].as_str()),
                ("true", "1")
            );
            assert_eq!(v["kvsname"], format!("vmf-{}", v["job"]));
            assert_eq!(v["pmi_jobid"], v["kvsname"]);
            assert_eq!(v["universe"], "6");
            assert_eq!(v["local"], format!("{size},{}", v["rank"]));
            assert_eq!(v["ctl"], "true", "no control socket for spawned processes");
            assert!(v["ld_first"].ends_with("/lib"), "{v:?}");
        }
    }
    // The port is the spawning job's: the parent's for s1 and the multi pair, the child's for the
    // grandchild.
    for v in pair.iter().chain(&multi) {
        assert_eq!(v["port"], format!("port-of-{job}"));
    }
    assert_eq!(grand[0]["port"], format!("port-of-{}", pair[0]["job"]));
    // Application numbers: the command index within the request.
    for v in pair.iter().chain(&grand) {
        assert_eq!(v["appnum"], "0");
    }
    let mut apps: Vec<(String, String)> = multi
        .iter()
        .map(|v| (v["rank"].clone(), v["appnum"].clone()))
        .collect();
    apps.sort();
    assert_eq!(
        apps,
        vec![("0".into(), "0".into()), ("1".into(), "1".into())]
    );
    // info wdir: the first children run in the directory given, the others where the launcher does.
    let wd = d.join("wd").canonicalize().unwrap();
    for v in &pair {
        assert_eq!(PathBuf::from(&v["cwd"]).canonicalize().unwrap(), wd);
    }
    for v in multi.iter().chain(&grand) {
        assert_ne!(PathBuf::from(&v["cwd"]), wd);
    }
    // Output is forwarded and tagged [sK.rank]; verbose names the spawned jobs.
    for (k, n) in [("s1", 2), ("s2", 2), ("s3", 1)] {
        for rank in 0..n {
            let want = format!("[{k}.{rank}] child {rank} of {job}-{k} says hello");
            assert!(so.lines().any(|l| l == want), "{want}\n{so}");
        }
        assert!(
            se.lines()
                .any(|l| l.starts_with(&format!("vmfabric: job {job}-{k}: {n} ranks of "))),
            "{se}"
        );
    }
    // Every region, the children's too, is gone.
    assert_eq!(region_leftovers(&d, &job), Vec::<String>::new());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn refused_spawn_requests_leave_the_job_running_works() {
    let d = tmp("refused");
    let u = 0; // not known without --universe-size
    let (o, so, se) = run_to_end(
        launch(&d, 1, "parent_refused", 0, u),
        Duration::from_secs(60),
    );
    assert_eq!(o.status.code(), Some(0), "stdout:\n{so}\nstderr:\n{se}");
    let refused = std::fs::read_to_string(d.join("refused")).unwrap();
    let lines: Vec<&str> = refused.lines().collect();
    assert!(
        lines[0].starts_with("Unable to spawn 1 process(es) of /nonexistent/vmf-no-such-program since the PMI server answered rc=-1")
            && lines[0].contains("/nonexistent/vmf-no-such-program_since_it_does_not_exist"),
        "{refused}"
    );
    assert!(
        lines[1].contains("host_far-away-node_is_not_this_machine"),
        "{refused}"
    );
    assert!(
        lines[2].contains("more_than_the_launcher's_limit_of_4096"),
        "{refused}"
    );
    // The launcher says why too, and the last request worked.
    assert!(
        se.contains("vmfabric: warning: the spawn request of rank 0 failed: cannot execute /nonexistent/vmf-no-such-program since it does not exist"),
        "{se}"
    );
    assert_eq!(reports(&d).len(), 1, "{se}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// A child that fails stops the job, with a line naming it (`spawned job 1 rank 1 (<program>, pid N)
/// <how>`); the other processes are stopped.
fn failing_children(plan: &str, code: i32, how: &str) {
    let d = tmp(plan);
    let u = 0; // not known without --universe-size
    let t = Instant::now();
    let (o, so, se) = run_to_end(
        launch(&d, 1, &format!("parent_{plan}"), 0, u),
        Duration::from_secs(30),
    );
    assert_eq!(o.status.code(), Some(code), "stdout:\n{so}\nstderr:\n{se}");
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "took {:?}",
        t.elapsed()
    );
    let job = job_of(&se);
    let stops: Vec<&str> = se
        .lines()
        .filter(|l| l.contains("stopping the job"))
        .collect();
    assert_eq!(stops.len(), 1, "{se}");
    let head = format!("vmfabric: spawned job 1 rank 1 ({}, pid ", me());
    let tail = format!(") {how}; stopping the job");
    let pid = stops[0]
        .strip_prefix(&head)
        .and_then(|r| r.strip_suffix(&tail))
        .unwrap_or_else(|| panic!("want {head}N{tail}\ngot  {}", stops[0]));
    assert!(pid.parse::<i32>().is_ok(), "{}", stops[0]);
    // The other child was stopped with the job.
    let pid_file = d.join(format!("pid-{job}-s1-0"));
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap_or_else(|e| panic!("{}: {e}\n{se}", pid_file.display()))
        .trim()
        .parse()
        .unwrap();
    assert!(!(ProcessId { pid, start_time: 0 }).is_alive());
    assert_eq!(region_leftovers(&d, &job), Vec::<String>::new());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn failing_child_fails_the_job_fails() {
    failing_children("fail-exit3", 3, "exited with code 3");
}

#[test]
fn killed_child_fails_the_job_fails() {
    failing_children("fail-kill", 137, "was killed by signal 9 (SIGKILL)");
}

#[test]
fn child_abort_stops_the_job_fails() {
    let d = tmp("abort");
    let u = 0; // not known without --universe-size
    let (o, so, se) = run_to_end(
        launch(&d, 1, "parent_abort5", 0, u),
        Duration::from_secs(30),
    );
    assert_eq!(o.status.code(), Some(5), "stdout:\n{so}\nstderr:\n{se}");
    let exe = me();
    assert!(
        se.lines().any(|l| l
            == format!(
                "vmfabric: spawned job 1 rank 0 ({exe}) called abort with code 5; stopping the job"
            )),
        "{se}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn launcher_signal_stops_children_works() {
    let d = tmp("sigterm");
    let u = 0; // not known without --universe-size
    let mut c = launch(&d, 1, "parent_sleep", 0, u);
    c.stdout(Stdio::null());
    let mut child = c.spawn().unwrap();
    let t = Instant::now();
    let pids = loop {
        let files: Vec<PathBuf> = std::fs::read_dir(&d)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("pid-"))
            .collect();
        let ready: Vec<i32> = files
            .iter()
            .filter_map(|f| std::fs::read_to_string(f).ok())
            .filter(|s| s.ends_with('\n'))
            .map(|s| s.trim().parse().unwrap())
            .collect();
        if ready.len() == 2 {
            break ready;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "children did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(128 + 15));
    for pid in pids {
        let t = Instant::now();
        while (ProcessId { pid, start_time: 0 }).is_alive() {
            assert!(t.elapsed() < Duration::from_secs(3), "child {pid} survived");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn universe_size_option_is_checked_fails() {
    let mut o = vmf_launch::RunOptions::new(4, "true", vec![]);
    o.region_dir = tmp("universe").join("regions");
    for bad in [0, 3, vmf_launch::MAX_RANKS + 1] {
        o.universe_size = Some(bad);
        let e = vmf_launch::run(&o).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!(
                "Unable to start the job since the universe size {bad} is not within 4..="
            )),
            "{e}"
        );
    }
    o.universe_size = Some(4);
    assert_eq!(vmf_launch::run(&o).unwrap(), 0);
    let _ = std::fs::remove_dir_all(o.region_dir.parent().unwrap());
}
