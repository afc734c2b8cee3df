//! `vmfabric sweep FILE`: 003_*'s smx_RunBenchmarks.pl as one command (issue 26). A sweep file (TOML)
//! names an MPI benchmark printing IMB-MPI1 tables and lists of parameters; every combination runs MPICH
//! over TCP across the vnic (`vmfabric vnic up` with those parameters), and optionally the same benchmark
//! over a veth bridge between the same namespaces (the baseline: the modern counterpart of Xen's
//! netfront). Each run keeps its output and performance values; the end is a CSV and plots in the shape
//! of 003_*'s Figures 33-39. A sweep resumes: finished runs (marked `done`) are not run again.
//!
//! ```toml
//! name = "mtu"                        # results in OUT/mtu/ (OUT: --out, default sweep-results)
//! program = "IMB-MPI1"                # optional: default IMB-MPI1 on PATH, else imb_lite (built here)
//! args = ["-iter", "200", "-msglog", "0:16"]
//! benchmarks = ["PingPong", "PingPing", "Sendrecv", "Bcast", "Alltoall", "Reduce"]
//! baseline = true                     # also over a veth bridge, once per (nodes, ranks, mtu)
//! timeout_s = 600                     # per run
//! [parameters]                        # each a value or a list; every combination runs
//! nodes = [2, 4]
//! ranks = 0                           # ranks of the benchmark, one per node; 0: all nodes
//! mtu = [576, 1500, 9000]
//! offload = false                     # default false: frames of MTU size, as 003_*'s sm_nic
//! vlb = [false, true]
//! irq_cost_ns = 0                     # any other `vmfabric vnic up` option, with underscores
//! ```
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const IMB_LITE: &str = include_str!("../../../bench/c/imb_lite.c");
const PLOT: &str = include_str!("../../../bench/sweep_plot.py");
/// Hydra's ssh launcher is called as `LAUNCHER -x HOST "CMD ..."`: HOST 10.77.0.{K+1} (vnic) or
/// 10.78.0.{K+1} (baseline bridge) is node K, so the command runs in namespace vnicK.
const LAUNCHER: &str = r#"#!/bin/sh
[ "$1" = -x ] && shift
host=$1; shift
case $host in 10.77.0.*|10.78.0.*) ;; *) echo "launcher: unexpected host $host" >&2; exit 1 ;; esac
exec ip netns exec "vnic$(( ${host##*.} - 1 ))" sh -c "$*"
"#;
const BRIDGE_NS: &str = "vnicbr";
const FINALIZE_LINE: &str = "# All processes entering MPI_Finalize";

#[derive(clap::Args)]
pub struct SweepArgs {
    /// The sweep file (TOML).
    file: PathBuf,
    /// Directory for results (a subdirectory per sweep name).
    #[arg(long, default_value = "sweep-results")]
    out: PathBuf,
    /// Redo every run, even those already done.
    #[arg(long)]
    fresh: bool,
    /// Only list the runs.
    #[arg(long)]
    dry_run: bool,
}

/// One parameter value.
#[derive(Debug, Clone, PartialEq)]
enum Val {
    Int(i64),
    Bool(bool),
    Str(String),
}

impl Val {
    fn text(&self) -> String {
        match self {
            Val::Int(i) => i.to_string(),
            Val::Bool(b) => b.to_string(),
            Val::Str(s) => s.clone(),
        }
    }
}

#[derive(Debug)]
struct Sweep {
    name: String,
    program: Option<String>,
    args: Vec<String>,
    benchmarks: Vec<String>,
    baseline: bool,
    timeout: Duration,
    params: BTreeMap<String, Vec<Val>>,
}

fn parse(text: &str) -> Result<Sweep, String> {
    let t: toml::Table = text.parse().map_err(|e| format!("not TOML: {e}"))?;
    let known = ["name", "program", "args", "benchmarks", "baseline", "timeout_s", "parameters"];
    if let Some(k) = t.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(format!("unknown key '{k}' (known: {})", known.join(", ")));
    }
    let strs = |k: &str| -> Result<Vec<String>, String> {
        match t.get(k) {
            None => Ok(Vec::new()),
            Some(toml::Value::Array(a)) => a
                .iter()
                .map(|v| match v {
                    toml::Value::String(s) => Ok(s.clone()),
                    toml::Value::Integer(i) => Ok(i.to_string()),
                    _ => Err(format!("'{k}' must be a list of strings")),
                })
                .collect(),
            Some(_) => Err(format!("'{k}' must be a list of strings")),
        }
    };
    let name = match t.get("name") {
        Some(toml::Value::String(s)) if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) => s.clone(),
        Some(_) => return Err("'name' must be letters, digits, '-', '_' or '.'".into()),
        None => "sweep".into(),
    };
    let mut params = BTreeMap::new();
    if let Some(p) = t.get("parameters") {
        let toml::Value::Table(p) = p else {
            return Err("'parameters' must be a table".into());
        };
        for (k, v) in p {
            let one = |v: &toml::Value| -> Result<Val, String> {
                match v {
                    toml::Value::Integer(i) => Ok(Val::Int(*i)),
                    toml::Value::Boolean(b) => Ok(Val::Bool(*b)),
                    toml::Value::String(s) => Ok(Val::Str(s.clone())),
                    _ => Err(format!("parameter '{k}': values are numbers, booleans or strings")),
                }
            };
            let vals = match v {
                toml::Value::Array(a) if a.is_empty() => return Err(format!("parameter '{k}' has an empty list")),
                toml::Value::Array(a) => a.iter().map(one).collect::<Result<Vec<_>, _>>()?,
                v => vec![one(v)?],
            };
            params.insert(k.clone(), vals);
        }
    }
    for (k, v) in [("nodes", Val::Int(2)), ("mtu", Val::Int(1500)), ("ranks", Val::Int(0)), ("offload", Val::Bool(false))] {
        params.entry(k.to_string()).or_insert_with(|| vec![v]);
    }
    let timeout = match t.get("timeout_s") {
        None => 600,
        Some(toml::Value::Integer(i)) if *i > 0 => *i as u64,
        Some(_) => return Err("'timeout_s' must be a positive number of seconds".into()),
    };
    Ok(Sweep {
        name,
        program: match t.get("program") {
            None => None,
            Some(toml::Value::String(s)) => Some(s.clone()),
            Some(_) => return Err("'program' must be a string".into()),
        },
        args: strs("args")?,
        benchmarks: strs("benchmarks")?,
        baseline: match t.get("baseline") {
            None => false,
            Some(toml::Value::Boolean(b)) => *b,
            Some(_) => return Err("'baseline' must be true or false".into()),
        },
        timeout: Duration::from_secs(timeout),
        params,
    })
}

/// One run: its parameters (every key of the sweep) and whether it is the baseline.
#[derive(Debug, Clone)]
struct Run {
    baseline: bool,
    p: BTreeMap<String, Val>,
}

impl Run {
    fn int(&self, k: &str) -> i64 {
        match self.p.get(k) {
            Some(Val::Int(i)) => *i,
            _ => 0,
        }
    }

    fn nodes(&self) -> usize {
        self.int("nodes") as usize
    }

    fn ranks(&self) -> usize {
        match self.int("ranks") {
            r if r <= 0 => self.nodes(),
            r => r as usize,
        }
    }

    fn id(&self) -> String {
        let kv: Vec<String> = self
            .p
            .iter()
            .map(|(k, v)| format!("{k}={}", v.text()))
            .collect();
        // A directory name and a CSV field: no '/', no ','.
        let id = format!("{}+{}", if self.baseline { "baseline" } else { "smn" }, kv.join("+"));
        id.chars().map(|c| if c.is_ascii_alphanumeric() || "=+-_.".contains(c) { c } else { '_' }).collect()
    }

    /// The swept parameters beyond nodes, ranks, mtu (the CSV's `params`).
    fn extra(&self) -> String {
        self.p
            .iter()
            .filter(|(k, _)| !["nodes", "ranks", "mtu"].contains(&k.as_str()))
            .map(|(k, v)| format!("{k}={}", v.text()))
            .collect::<Vec<_>>()
            .join(";")
    }
}

fn expand(s: &Sweep) -> Result<Vec<Run>, String> {
    let mut runs = vec![BTreeMap::new()];
    for (k, vals) in &s.params {
        let mut next = Vec::new();
        for r in &runs {
            for v in vals {
                let mut r: BTreeMap<String, Val> = r.clone();
                r.insert(k.clone(), v.clone());
                next.push(r);
            }
        }
        runs = next;
    }
    let mut out: Vec<Run> = Vec::new();
    for p in runs {
        let r = Run { baseline: false, p };
        if !(2..=64).contains(&r.nodes()) || r.ranks() > r.nodes() || r.ranks() < 1 {
            return Err(format!("run {}: needs 2..=64 nodes and 1..=nodes ranks", r.id()));
        }
        out.push(r);
    }
    if s.baseline {
        // Once per (nodes, ranks, mtu, offload): the bridge has no other parameters.
        let mut seen = std::collections::BTreeSet::new();
        let base: Vec<Run> = out
            .iter()
            .filter_map(|r| {
                let p: BTreeMap<String, Val> = r
                    .p
                    .iter()
                    .filter(|(k, _)| ["nodes", "ranks", "mtu", "offload"].contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                let b = Run { baseline: true, p };
                seen.insert(b.id()).then_some(b)
            })
            .collect();
        out.extend(base);
    }
    Ok(out)
}

/// `vmfabric vnic up` arguments for a run's parameters.
fn up_args(r: &Run) -> Vec<String> {
    let mut a = vec!["vnic".into(), "up".into()];
    for (k, v) in &r.p {
        match (k.as_str(), v) {
            ("ranks", _) => {}
            ("offload", Val::Bool(false)) => a.push("--no-offload".into()),
            ("offload", _) => {}
            (k, Val::Bool(true)) => a.push(format!("--{}", k.replace('_', "-"))),
            (_, Val::Bool(false)) => {}
            (k, v) => {
                a.push(format!("--{}", k.replace('_', "-")));
                a.push(v.text());
            }
        }
    }
    if r.baseline {
        // The namespaces only: no VLB or costs matter for the bridge.
        a.retain(|x| !x.starts_with("--vlb"));
    }
    a
}

fn sh(args: &[&str]) -> Result<(), String> {
    let o = Command::new(args[0]).args(&args[1..]).stdin(Stdio::null()).output().map_err(|e| format!("{}: {e}", args[0]))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!("'{}' failed: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim()))
    }
}

fn bridge_down() {
    let _ = Command::new("ip").args(["netns", "del", BRIDGE_NS]).stderr(Stdio::null()).status();
}

/// The baseline: a bridge in namespace vnicbr and a veth `vbr0` into every vnicK at 10.78.0.{K+1}/24.
fn bridge_up(nodes: usize, mtu: usize, offload: bool) -> Result<(), String> {
    bridge_down();
    let m = mtu.to_string();
    sh(&["ip", "netns", "add", BRIDGE_NS])?;
    sh(&["ip", "-n", BRIDGE_NS, "link", "add", "br0", "type", "bridge"])?;
    sh(&["ip", "-n", BRIDGE_NS, "link", "set", "br0", "mtu", &m, "up"])?;
    for k in 0..nodes {
        let (inner, outer, ns) = ("vbr0".to_string(), format!("vbrp{k}"), format!("vnic{k}"));
        sh(&["ip", "-n", BRIDGE_NS, "link", "add", &outer, "mtu", &m, "type", "veth", "peer", "name", &inner, "netns", &ns])?;
        sh(&["ip", "-n", BRIDGE_NS, "link", "set", &outer, "master", "br0", "up"])?;
        sh(&["ip", "-n", &ns, "link", "set", &inner, "mtu", &m, "up"])?;
        sh(&["ip", "-n", &ns, "addr", "add", &format!("10.78.0.{}/24", k + 1), "dev", &inner])?;
        if !offload {
            // Frames of MTU size on the baseline too (as on the vnic without offload).
            let _ = sh(&["ip", "netns", "exec", &ns, "ethtool", "-K", &inner, "tso", "off", "gso", "off", "gro", "off"]);
        }
    }
    Ok(())
}

fn vmfabric(args: &[String]) -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let o = Command::new(exe).args(args).stdin(Stdio::null()).output().map_err(|e| e.to_string())?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    } else {
        Err(format!("vmfabric {} failed: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim()))
    }
}

/// The benchmark program: the sweep's, IMB-MPI1 on PATH, or imb_lite compiled into `dir`.
fn program(s: &Sweep, dir: &Path) -> Result<String, String> {
    if let Some(p) = &s.program {
        return Ok(p.clone());
    }
    if let Some(p) = which("IMB-MPI1") {
        return Ok(p.display().to_string());
    }
    let src = dir.join("imb_lite.c");
    let exe = dir.join("imb_lite");
    if !exe.exists() {
        std::fs::write(&src, IMB_LITE).map_err(|e| e.to_string())?;
        let o = Command::new("mpicc.mpich")
            .args(["-O2", "-o"])
            .arg(&exe)
            .arg(&src)
            .output()
            .map_err(|e| format!("cannot run mpicc.mpich (install mpich and libmpich-dev): {e}"))?;
        if !o.status.success() {
            return Err(format!("mpicc.mpich failed: {}", String::from_utf8_lossy(&o.stderr)));
        }
    }
    Ok(exe.display().to_string())
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// Run the benchmark for `r` (the vnic or the bridge is up). Output to `out`; returns whether it
/// completed. MPICH 4.0.2 over UCX TCP may hang in MPI_Finalize (it closes endpoints before its last
/// barrier, fixed in 4.2.0): once the benchmark printed IMB's last line the run is complete, and a job
/// that then does not end within 5 s is stopped.
fn run_benchmark(s: &Sweep, r: &Run, prog: &str, launcher: &Path, out: &Path) -> Result<(), String> {
    let (net, iface) = if r.baseline { ("10.78.0", "vbr0") } else { ("10.77.0", "smn0") };
    let hosts: Vec<String> = (0..r.ranks()).map(|k| format!("{net}.{}", k + 1)).collect();
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.args(["vnic", "exec", "0", "--", "mpiexec.mpich", "-hosts", &hosts.join(","), "-n"])
        .arg(r.ranks().to_string())
        .args(["-ppn", "1", "-iface", iface, "-launcher", "ssh", "-launcher-exec"])
        .arg(launcher)
        .args(["-genv", "UCX_TLS", "tcp,self", "-genv", "UCX_NET_DEVICES", iface, "-genv", "MPIR_CVAR_NOLOCAL", "1"])
        .arg(prog)
        .args(&s.args)
        .args(&s.benchmarks)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setsid in the child before exec (own process group, so the whole job can be stopped).
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| format!("cannot start mpiexec: {e}"))?;
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let file = std::fs::File::create(out).map_err(|e| e.to_string())?;
    let finished = std::sync::Arc::new(std::sync::Mutex::new(None::<Instant>));
    let f2 = finished.clone();
    let reader = std::thread::spawn(move || {
        let mut file = file;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = writeln!(file, "{line}");
            if line.trim_start().starts_with(FINALIZE_LINE) {
                *f2.lock().unwrap() = Some(Instant::now());
            }
        }
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut s);
        s
    });
    let start = Instant::now();
    let pgid = child.id() as i32;
    let status = loop {
        if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
            break Some(st);
        }
        let fin = *finished.lock().unwrap();
        let stuck_in_finalize = fin.is_some_and(|t| t.elapsed() > Duration::from_secs(5));
        if stuck_in_finalize || start.elapsed() > s.timeout {
            // SAFETY: the job's own process group.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // A descendant that left the process group may still hold the pipes: do not wait for it forever.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !(reader.is_finished() && err_reader.is_finished()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let err = if err_reader.is_finished() { err_reader.join().unwrap_or_default() } else { String::new() };
    let _ = std::fs::write(out.with_extension("stderr"), &err);
    let complete = finished.lock().unwrap().is_some();
    match status {
        Some(st) if st.success() => Ok(()),
        None if complete => Ok(()),
        None => Err(format!("timed out after {} s", s.timeout.as_secs())),
        Some(st) => Err(format!("mpiexec failed ({st}): {}", err.lines().rev().take(3).collect::<Vec<_>>().join(" | "))),
    }
}

/// The IMB tables of one output: (benchmark, processes, bytes, repetitions, t, t_min, t_max, MB/s).
type Row = (String, usize, u64, u64, f64, Option<f64>, Option<f64>, Option<f64>);

fn parse_imb(text: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    let (mut bench, mut procs, mut cols): (String, usize, Vec<String>) = (String::new(), 0, Vec::new());
    for line in text.lines() {
        let l = line.trim();
        if let Some(b) = l.strip_prefix("# Benchmarking ") {
            bench = b.trim().to_string();
            cols.clear();
        } else if let Some(p) = l.strip_prefix("# #processes = ") {
            procs = p.split_whitespace().next().and_then(|x| x.parse().ok()).unwrap_or(0);
        } else if l.starts_with("#bytes") {
            cols = l.split_whitespace().map(String::from).collect();
        } else if !l.starts_with('#') && !cols.is_empty() && !bench.is_empty() {
            let v: Vec<f64> = l.split_whitespace().filter_map(|x| x.parse().ok()).collect();
            if v.len() != cols.len() {
                continue;
            }
            let get = |name: &str| cols.iter().position(|c| c == name).map(|i| v[i]);
            let t = get("t[usec]").or(get("t_avg[usec]"));
            if let Some(t) = t {
                rows.push((bench.clone(), procs, v[0] as u64, v[1] as u64, t, get("t_min[usec]"), get("t_max[usec]"), get("Mbytes/sec")));
            }
        }
    }
    rows
}

/// A CSV field, quoted (parameter values such as `broken_links = "0-3,1-2"` hold commas).
fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

fn python_with_matplotlib() -> Option<String> {
    ["python3", "/usr/bin/python3"].into_iter().map(String::from).find(|p| {
        Command::new(p)
            .args(["-c", "import matplotlib"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

pub fn run(a: SweepArgs) -> i32 {
    match sweep(a) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("vmfabric sweep: {e}");
            1
        }
    }
}

fn sweep(a: SweepArgs) -> Result<(), String> {
    let text = std::fs::read_to_string(&a.file).map_err(|e| format!("cannot read {}: {e}", a.file.display()))?;
    let s = parse(&text).map_err(|e| format!("{}: {e}", a.file.display()))?;
    let runs = expand(&s)?;
    if a.dry_run {
        for r in &runs {
            println!("{}", r.id());
        }
        return Ok(());
    }
    let dir = a.out.join(&s.name);
    std::fs::create_dir_all(dir.join("runs")).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let dir = dir.canonicalize().map_err(|e| e.to_string())?;
    let launcher = dir.join("launch");
    std::fs::write(&launcher, LAUNCHER).map_err(|e| e.to_string())?;
    std::fs::set_permissions(&launcher, <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755)).map_err(|e| e.to_string())?;
    let _ = std::fs::copy(&a.file, dir.join("sweep.toml"));
    let prog = program(&s, &dir)?;
    if vmf_vnic::running().is_some() {
        return Err("a vnic is up; a sweep brings its own up and down ('vmfabric vnic down' first)".into());
    }
    let todo: Vec<&Run> = runs.iter().filter(|r| a.fresh || !dir.join("runs").join(r.id()).join("done").exists()).collect();
    println!(
        "sweep {}: {} runs ({} already done), benchmark {prog}, results in {}",
        s.name,
        runs.len(),
        runs.len() - todo.len(),
        dir.display()
    );
    let bar = ProgressBar::new(runs.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} runs, {elapsed_precise} (eta {eta}) {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_position((runs.len() - todo.len()) as u64);
    let mut failed = Vec::new();
    for r in todo {
        let rd = dir.join("runs").join(r.id());
        std::fs::create_dir_all(&rd).map_err(|e| e.to_string())?;
        let _ = std::fs::remove_file(rd.join("done"));
        bar.set_message(r.id());
        let res = (|| -> Result<(), String> {
            vmfabric(&up_args(r))?;
            if r.baseline {
                bridge_up(r.nodes(), r.int("mtu") as usize, matches!(r.p.get("offload"), Some(Val::Bool(true))))?;
            }
            let out = rd.join("output.txt");
            let res = run_benchmark(&s, r, &prog, &launcher, &out);
            if !r.baseline {
                if let Ok(j) = vmfabric(&["vnic".into(), "stats".into(), "--json".into()]) {
                    let _ = std::fs::write(rd.join("stats.json"), j);
                }
            }
            res
        })();
        bridge_down();
        let _ = vmfabric(&["vnic".into(), "down".into(), "--quiet".into()]);
        match res {
            Ok(()) => {
                std::fs::write(rd.join("done"), b"").map_err(|e| e.to_string())?;
            }
            Err(e) => {
                bar.println(format!("run {} failed: {e}", r.id()));
                let _ = std::fs::write(rd.join("error.txt"), &e);
                failed.push(r.id());
            }
        }
        bar.inc(1);
    }
    bar.finish_with_message("done");
    // The CSV of every finished run.
    let mut csv = String::from("run,kind,nodes,ranks,mtu,params,benchmark,bytes,repetitions,t_usec,t_min_usec,t_max_usec,mbytes_per_sec\n");
    let opt = |x: Option<f64>| x.map_or(String::new(), |v| format!("{v}"));
    let mut n_rows = 0;
    for r in &runs {
        let rd = dir.join("runs").join(r.id());
        if !rd.join("done").exists() {
            continue;
        }
        let text = std::fs::read_to_string(rd.join("output.txt")).unwrap_or_default();
        for (b, procs, bytes, reps, t, tmin, tmax, mb) in parse_imb(&text) {
            csv.push_str(&format!(
                "{},{},{},{},{},{},{b},{bytes},{reps},{t},{},{},{}\n",
                quote(&r.id()),
                if r.baseline { "baseline" } else { "smn" },
                r.nodes(),
                procs,
                r.int("mtu"),
                quote(&r.extra()),
                opt(tmin),
                opt(tmax),
                opt(mb)
            ));
            n_rows += 1;
        }
    }
    let csv_path = dir.join("results.csv");
    std::fs::write(&csv_path, csv).map_err(|e| e.to_string())?;
    println!("{n_rows} rows in {}", csv_path.display());
    match python_with_matplotlib() {
        Some(py) => {
            let script = dir.join("sweep_plot.py");
            std::fs::write(&script, PLOT).map_err(|e| e.to_string())?;
            let o = Command::new(py).arg(&script).arg(&csv_path).arg(dir.join("plots")).output().map_err(|e| e.to_string())?;
            if !o.status.success() {
                return Err(format!("plotting failed: {}", String::from_utf8_lossy(&o.stderr)));
            }
            print!("{}", String::from_utf8_lossy(&o.stdout));
        }
        None => eprintln!("vmfabric sweep: no python3 with matplotlib: plots skipped (apt-get install python3-matplotlib)"),
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("{} runs failed (see runs/*/error.txt; run the sweep again to retry them): {}", failed.len(), failed.join(" ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_files_expand_and_name_runs() {
        let s = parse(
            "name = \"t\"\nbaseline = true\nbenchmarks = [\"PingPong\"]\n[parameters]\nnodes = [2, 3]\nmtu = [576, 1500]\nvlb = [false, true]\n",
        )
        .unwrap();
        let runs = expand(&s).unwrap();
        // 2 x 2 x 2 on the vnic, plus one baseline per (nodes, mtu).
        assert_eq!(runs.len(), 8 + 4);
        let ids: std::collections::BTreeSet<String> = runs.iter().map(|r| r.id()).collect();
        assert_eq!(ids.len(), runs.len(), "run ids are unique");
        let r = runs.iter().find(|r| !r.baseline && r.p["vlb"] == Val::Bool(true)).unwrap();
        let up = up_args(r);
        assert!(up.contains(&"--vlb".to_string()) && up.contains(&"--no-offload".to_string()), "{up:?}");
        assert!(up.windows(2).any(|w| w[0] == "--mtu" && w[1] == "576"), "{up:?}");
        assert_eq!(r.extra(), "offload=false;vlb=true");
        assert!(parse("nme = 1").unwrap_err().contains("unknown key 'nme'"));
        assert!(parse("[parameters]\nnodes = []").unwrap_err().contains("empty list"));
        assert!(expand(&parse("[parameters]\nnodes = 1").unwrap()).is_err());
    }

    #[test]
    fn imb_tables_parse() {
        let t = "#---\n# Benchmarking PingPong\n# #processes = 2\n#---\n       #bytes #repetitions      t[usec]   Mbytes/sec\n            0         1000         0.50         0.00\n         1024         1000         2.00       488.28\n\n#---\n# Benchmarking Bcast\n# #processes = 4\n       #bytes #repetitions  t_min[usec]  t_max[usec]  t_avg[usec]\n            8          100         1.00         3.00         2.00\n";
        let rows = parse_imb(t);
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[1], ("PingPong".into(), 2, 1024, 1000, 2.0, None, None, Some(488.28)));
        assert_eq!(rows[2], ("Bcast".into(), 4, 8, 100, 2.0, Some(1.0), Some(3.0), None));
    }
}
