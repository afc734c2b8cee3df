//! `vmfabric dvm run` and `vmfabric dvm asm` through the real binary: every example application
//! (examples/dvm) on 1, 2 and 4 compute nodes, in place, on copies and interpreted, once across two
//! emulated hosts, and the messages and exit status of assembler errors, traps and bad nodes.txt files.
//! Every application runs on a copy in a temporary directory with its own region directory; every
//! command has a time limit (its process group is killed when it runs out).
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_vmfabric")
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/dvm")
}

/// A fresh temporary directory, removed at the end.
struct Tmp(PathBuf);

impl Tmp {
    fn new(name: &str) -> Tmp {
        let d = std::env::temp_dir().join(format!("vmf-dvm-cli-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Tmp(d)
    }
    fn path(&self, p: &str) -> PathBuf {
        self.0.join(p)
    }
    fn write(&self, p: &str, text: &str) -> PathBuf {
        let f = self.path(p);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(&f, text).unwrap();
        f
    }
}

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const LIMIT: Duration = Duration::from_secs(120);

/// `vmfabric ARGS` with region directory `regions`, no input, at most `limit`.
fn vmf(args: &[&str], regions: &Path, limit: Duration) -> Output {
    std::fs::create_dir_all(regions).unwrap();
    let mut child = Command::new(bin())
        .args(args)
        .env("VMF_REGION_DIR", regions)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > limit {
            // the launcher and every rank it started
            // SAFETY: a plain kill(2) of the child's process group.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let o = child.wait_with_output().unwrap();
            panic!(
                "vmfabric {args:?} took more than {limit:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The `ID: VALUE` lines of a successful run (nothing else on stdout or stderr).
fn values(o: &Output, what: &str) -> Vec<(u64, i64)> {
    let (out, err) = (stdout(o), stderr(o));
    assert!(o.status.success(), "{what}: {:?}\nstdout:\n{out}\nstderr:\n{err}", o.status);
    assert!(err.is_empty(), "{what}: stderr:\n{err}");
    out.lines()
        .map(|l| {
            let (id, v) = l.split_once(": ").unwrap_or_else(|| panic!("{what}: not 'ID: VALUE': {l:?}"));
            (id.parse().unwrap(), v.parse().unwrap_or_else(|_| panic!("{what}: {l:?}")))
        })
        .collect()
}

/// A copy of example `name` for `computes` compute nodes (IDs 10, 11, ...), the node count in its
/// program rewritten to match; with `hosts`, page nodes on host0 and compute nodes alternately on
/// host1 and host0. Returns the directory and the compute nodes' IDs.
fn example(tmp: &Tmp, name: &str, computes: usize, hosts: bool) -> (PathBuf, Vec<u64>) {
    let src = examples().join(name);
    let dir = tmp.path(&format!("{name}-{computes}{}", if hosts { "-hosts" } else { "" }));
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    let addr = |i: usize| if hosts { format!("host{}", (i + 1) % 2) } else { "127.0.0.1".into() };
    // the page nodes as the example has them
    let orig = std::fs::read_to_string(src.join("nodes.txt")).unwrap();
    let mut nodes = String::from("[pagenodes]\n");
    let mut in_pages = false;
    for l in orig.lines() {
        let l = l.trim();
        if l.starts_with('[') {
            in_pages = l == "[pagenodes]";
        } else if in_pages && !l.is_empty() && !l.starts_with('#') {
            let f: Vec<&str> = l.split_whitespace().collect();
            let a = if hosts { "host0" } else { f[1] };
            nodes.push_str(&format!("{} {a} {}\n", f[0], f[2]));
        }
    }
    nodes.push_str("[computenodes]\n");
    let ids: Vec<u64> = (0..computes as u64).map(|i| 10 + i).collect();
    let others = |me: u64| ids.iter().filter(|&&i| i != me).map(|i| i.to_string()).collect::<Vec<_>>();
    for (i, &id) in ids.iter().enumerate() {
        let (file, peers) = match name {
            "prodcons" if i == 0 => ("producer.dass", others(id)),
            "prodcons" => ("consumer.dass", vec!["10".to_string()]),
            "store" if i == 0 => ("store.dass", others(id)),
            "store" => ("poller.dass", vec![]),
            _ => (match name {
                "iteration" => "iteration.dass",
                "sum" => "sum.dass",
                "matmul" => "matmul.dass",
                _ => unreachable!(),
            }, vec![]),
        };
        nodes.push_str(&format!("{id} {} {file} {} {}\n", addr(i), peers.len(), peers.join(" ")));
    }
    std::fs::write(dir.join("nodes.txt"), nodes).unwrap();
    match name {
        "sum" => rewrite(&dir, "sum.dass", "set 200 $", format!("set 200 ${computes}")),
        "matmul" => rewrite(&dir, "matmul.dass", "set 200 $", format!("set 200 ${computes}")),
        "prodcons" => rewrite(&dir, "producer.dass", "set 200 $", format!("set 200 ${}", computes - 1)),
        _ => {}
    }
    (dir, ids)
}

/// Replace the one line of `dir`/`file` that starts with `from` by `to`.
fn rewrite(dir: &Path, file: &str, from: &str, to: String) {
    let p = dir.join(file);
    let text = std::fs::read_to_string(&p).unwrap();
    assert_eq!(text.lines().filter(|l| l.trim_start().starts_with(from)).count(), 1, "{file}: one '{from}' line");
    let text: String = text
        .lines()
        .map(|l| if l.trim_start().starts_with(from) { to.clone() } else { l.to_string() })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&p, text + "\n").unwrap();
}

/// Run example `name` on each count of compute nodes, in place, on copies and interpreted, and check
/// the printed values with `check(ids, values, what)`.
fn each_way(name: &str, counts: &[usize], check: impl Fn(&[u64], Vec<(u64, i64)>, &str)) {
    let tmp = Tmp::new(name);
    for &n in counts {
        let (dir, ids) = example(&tmp, name, n, false);
        for how in [&[][..], &["--copy"][..], &["--interpret"][..]] {
            let regions = tmp.path(&format!("regions-{n}-{}", how.join("")));
            let mut args = vec!["dvm", "run"];
            args.extend_from_slice(how);
            let d = dir.display().to_string();
            args.push(&d);
            let what = format!("{name} on {n} compute nodes {how:?}");
            let o = vmf(&args, &regions, LIMIT);
            check(&ids, values(&o, &what), &what);
            let left: Vec<_> = std::fs::read_dir(&regions).unwrap().flatten().map(|e| e.file_name()).collect();
            assert!(left.is_empty(), "{what}: left behind in the region directory: {left:?}");
        }
    }
}

fn check_sum(ids: &[u64], mut v: Vec<(u64, i64)>, what: &str) {
    v.sort();
    let want: Vec<(u64, i64)> = ids.iter().map(|&id| (id, 500_000_500_000)).collect();
    assert_eq!(v, want, "{what}");
}

fn check_matmul(ids: &[u64], v: Vec<(u64, i64)>, what: &str) {
    // printed once, by the node that took the first ticket
    assert_eq!(v.len(), 1, "{what}: {v:?}");
    assert!(ids.contains(&v[0].0), "{what}: {v:?}");
    assert_eq!(v[0].1, 359_352_000, "{what}");
}

fn check_prodcons(_: &[u64], v: Vec<(u64, i64)>, what: &str) {
    // what was produced and what the consumers took: 1 + ... + 10000
    assert_eq!(v, [(10, 50_005_000), (10, 50_005_000)], "{what}");
}

fn check_prodcons_1000(_: &[u64], v: Vec<(u64, i64)>, what: &str) {
    assert_eq!(v, [(10, 500_500), (10, 500_500)], "{what}");
}

fn check_iteration(ids: &[u64], v: Vec<(u64, i64)>, what: &str) {
    for &id in ids {
        let mine: Vec<i64> = v.iter().filter(|(n, _)| *n == id).map(|&(_, x)| x).collect();
        assert_eq!(mine.len(), 3, "{what}: node {id}: {v:?}");
        assert_eq!(mine[0], 0, "{what}: node {id}");
        assert!(mine[1] >= 0, "{what}: node {id}: time {}", mine[1]);
        assert_eq!(mine[2], 499_999_500_000, "{what}: node {id}");
    }
    assert_eq!(v.len(), 3 * ids.len(), "{what}: {v:?}");
}

fn check_store(_: &[u64], v: Vec<(u64, i64)>, what: &str) {
    // the store node prints its rate (bytes per µs); the pollers print nothing
    assert_eq!(v.len(), 1, "{what}: {v:?}");
    assert_eq!(v[0].0, 10, "{what}");
    assert!(v[0].1 > 0, "{what}: {v:?}");
}

#[test]
fn sum_on_1_2_and_4_nodes() {
    each_way("sum", &[1, 2, 4], check_sum);
}

#[test]
fn matmul_on_1_2_and_4_nodes() {
    each_way("matmul", &[1, 2, 4], check_matmul);
}

#[test]
fn prodcons_with_1_2_and_3_consumers() {
    // a producer needs at least one consumer: 2, 3 and 4 compute nodes
    each_way("prodcons", &[2, 3, 4], check_prodcons);
}

#[test]
fn iteration_on_1_2_and_4_nodes() {
    each_way("iteration", &[1, 2, 4], check_iteration);
}

#[test]
fn store_with_1_and_3_pollers() {
    // the store node waits for a poller: 2 and 4 compute nodes
    each_way("store", &[2, 4], check_store);
}

/// Whether emulated hosts can run here (root and working network namespaces).
fn hosts_usable() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let ip = Command::new("ip")
        .args(["netns", "list"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    root && ip
}

#[test]
fn every_example_across_two_emulated_hosts() {
    if !hosts_usable() {
        println!("note: skipped, emulated hosts need root and 'ip netns'");
        return;
    }
    let tmp = Tmp::new("hosts");
    type Check = fn(&[u64], Vec<(u64, i64)>, &str);
    let apps: [(&str, usize, Check); 5] = [
        ("sum", 4, check_sum),
        ("matmul", 2, check_matmul),
        // 1000 items, not 10000: each takes several round trips between the hosts (~14 s in all)
        ("prodcons", 3, check_prodcons_1000),
        ("iteration", 2, check_iteration),
        ("store", 2, check_store),
    ];
    for (name, n, check) in apps {
        let (dir, ids) = example(&tmp, name, n, true);
        if name == "prodcons" {
            rewrite(&dir, "producer.dass", "set 201 $", "set 201 $1000".into());
        }
        let text = std::fs::read_to_string(dir.join("nodes.txt")).unwrap();
        assert!(text.contains(" host0 ") && text.contains(" host1 "), "{text}");
        let d = dir.display().to_string();
        let what = format!("{name} on {n} compute nodes across 2 hosts");
        let o = vmf(&["dvm", "run", "--hosts", "2", &d], &tmp.path(&format!("regions-{name}")), Duration::from_secs(180));
        check(&ids, values(&o, &what), &what);
    }
}

/// An application of one page node and compute node 2 running `a.dass` = `src`.
fn one_node_app(tmp: &Tmp, src: &str) -> PathBuf {
    tmp.write("app/nodes.txt", "[pagenodes]\n1 127.0.0.1 0\n[computenodes]\n2 127.0.0.1 a.dass 0\n");
    tmp.write("app/a.dass", src);
    tmp.path("app")
}

#[test]
fn an_assembler_error_fails_with_file_line_and_column() {
    let tmp = Tmp::new("asmerr");
    let dir = one_node_app(&tmp, "set 0 $1\nadd 0 $x\nhlt\n");
    let o = vmf(&["dvm", "run", &dir.display().to_string()], &tmp.path("regions"), LIMIT);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(stderr(&o), "vmfabric dvm: a.dass:2:7: 'x' is not a number\n");
    assert_eq!(stdout(&o), "");
}

#[test]
fn a_trap_fails_and_names_the_node_thread_and_instruction() {
    let tmp = Tmp::new("trap");
    let dir = one_node_app(&tmp, "set 0 $1\nout 0\nset 1 $0\ndiv 0 1   ; by zero\nhlt\n");
    let d = dir.display().to_string();
    for how in [&[][..], &["--interpret"][..], &["--copy"][..]] {
        let mut args = vec!["dvm", "run"];
        args.extend_from_slice(how);
        args.push(&d);
        let o = vmf(&args, &tmp.path("regions"), LIMIT);
        let err = stderr(&o);
        assert!(!o.status.success(), "{how:?}: {err}");
        assert!(
            err.lines().any(|l| l == "vmfabric dvm: trap on node 2, thread 0, at a.dass:4 (div 0 1): division by zero"),
            "{how:?}: {err}"
        );
        assert!(err.contains("trap on node"), "{err}");
        // what the node printed before the trap
        assert_eq!(stdout(&o), "2: 1\n", "{how:?}");
    }
    // traps that once crashed a node instead: a jump to a label after the last instruction (the
    // compiler), a register count so large that d + n overflows (the interpreter)
    let cases = [
        ("jmp end\nhlt\n:end\n", "at a.dass: past the last instruction: ran past the last instruction (no hlt)"),
        (
            "lod $0 1 $9223372036854775807\nhlt\n",
            "at a.dass:1 (lod $0 1 $9223372036854775807): registers 1..1+9223372036854775807 outside 0..255",
        ),
    ];
    for (src, msg) in cases {
        tmp.write("app/a.dass", src);
        for how in [&[][..], &["--interpret"][..]] {
            let mut args = vec!["dvm", "run"];
            args.extend_from_slice(how);
            args.push(&d);
            let o = vmf(&args, &tmp.path("regions"), LIMIT);
            let err = stderr(&o);
            assert_eq!(o.status.code(), Some(3), "{how:?}: {err}");
            assert!(err.lines().any(|l| l == format!("vmfabric dvm: trap on node 2, thread 0, {msg}")), "{how:?}: {err}");
        }
    }
    // across processes: two compute nodes, each waiting for a signal nobody sends
    tmp.write(
        "dl/nodes.txt",
        "[pagenodes]\n1 127.0.0.1 0\n[computenodes]\n2 127.0.0.1 a.dass 0\n3 127.0.0.1 b.dass 0\n",
    );
    tmp.write("dl/a.dass", "wait $1\nhlt\n");
    tmp.write("dl/b.dass", "wait $2\nhlt\n");
    let o = vmf(&["dvm", "run", &tmp.path("dl").display().to_string()], &tmp.path("regions"), LIMIT);
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.lines().any(|l| {
            l == "vmfabric dvm: trap on node 2, thread 0, at a.dass:1 (wait $1): deadlock: every thread of the application waits"
                || l == "vmfabric dvm: trap on node 3, thread 0, at b.dass:1 (wait $2): deadlock: every thread of the application waits"
        }),
        "{err}"
    );
}

#[test]
fn a_bad_nodes_txt_fails_with_its_line() {
    let tmp = Tmp::new("badnodes");
    tmp.write("app/a.dass", "hlt\n");
    let nodes = tmp.path("app/nodes.txt");
    let d = tmp.path("app").display().to_string();
    let cases = [
        (
            "[pagenodes]\n1 127.0.0.1 0\n[computenodes]\n2 10.0.0.1 a.dass 0\n",
            "4: address '10.0.0.1' of node 2 is not a host of this run (127.0.0.1 or localhost (host0.. with --hosts))",
        ),
        (
            "# comment\n[pagenodes]\n1 127.0.0.1 0\n\n[computenodes]\n2 127.0.0.1 a.dass 2 3\n",
            "6: compute node 2: peer count 2 but 1 peers listed",
        ),
        ("[pagenodes]\n1 127.0.0.1 0\n[computenodes]\n1 127.0.0.1 a.dass 0\n", "4: node ID 1 is already used at line 2"),
        ("[pages]\n1 127.0.0.1 0\n", "1: unknown section '[pages]' (expected [pagenodes] or [computenodes])"),
        ("[pagenodes]\n1 127.0.0.1 0 7\n[computenodes]\n2 127.0.0.1 a.dass 0\n", "2: page node 1: expected 'ID address mapping', found 4 fields"),
        ("[pagenodes]\n1 127.0.0.1 0\n2 127.0.0.1 0\n[computenodes]\n3 127.0.0.1 a.dass 0\n", "3: page node 2: mapping 0 overlaps page node 1"),
    ];
    for (text, msg) in cases {
        std::fs::write(&nodes, text).unwrap();
        let o = vmf(&["dvm", "run", &d], &tmp.path("regions"), LIMIT);
        assert_eq!(o.status.code(), Some(2), "{text}: {}", stderr(&o));
        assert_eq!(stderr(&o), format!("vmfabric dvm: {}:{msg}\n", nodes.display()), "{text}");
    }
    // a program that cannot be read: the line naming it
    std::fs::write(&nodes, "[pagenodes]\n1 127.0.0.1 0\n[computenodes]\n2 127.0.0.1 a.dass 0\n3 127.0.0.1 b.dass 0\n").unwrap();
    let o = vmf(&["dvm", "run", &d], &tmp.path("regions"), LIMIT);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o),
        format!(
            "vmfabric dvm: {}:5: compute node 3: cannot read '{}': No such file or directory (os error 2)\n",
            nodes.display(),
            tmp.path("app/b.dass").display()
        )
    );
}

#[test]
fn dvm_asm_reports_instruction_counts_or_every_error() {
    let tmp = Tmp::new("asm");
    let regions = tmp.path("regions");
    let good = tmp.write("good.dass", "; three instructions\n:top\nset 0 $1\nout 0\njmp top\n");
    let bad = tmp.write("bad.dass", "mov 0 $1\nset 0 $1\njmp nowhere\nadd 0\nhlt\n");
    let (g, b) = (good.display().to_string(), bad.display().to_string());
    let o = vmf(&["dvm", "asm", &g], &regions, LIMIT);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), format!("{g}: 3 instructions\n"));
    assert_eq!(stderr(&o), "");
    let o = vmf(&["dvm", "asm", &b], &regions, LIMIT);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stdout(&o), "");
    assert_eq!(
        stderr(&o),
        format!(
            "{b}:1:1: unknown mnemonic 'mov'\n{b}:3:5: undefined label 'nowhere'\n{b}:4:1: 'add' takes register value; 1 operand given\n"
        )
    );
    // several files: the good one is reported, the bad one fails the command
    let o = vmf(&["dvm", "asm", &g, &b], &regions, LIMIT);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stdout(&o), format!("{g}: 3 instructions\n"));
    assert!(stderr(&o).starts_with(&format!("{b}:1:1: unknown mnemonic 'mov'\n")), "{}", stderr(&o));
    // a missing file
    let missing = tmp.path("missing.dass").display().to_string();
    let o = vmf(&["dvm", "asm", &missing], &regions, LIMIT);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stderr(&o), format!("{missing}: No such file or directory (os error 2)\n"));
    // the register count
    let o = vmf(&["dvm", "asm", "--registers", "8", &g], &regions, LIMIT);
    assert!(o.status.success());
    let eight = tmp.write("eight.dass", "set 8 $1\nhlt\n").display().to_string();
    let o = vmf(&["dvm", "asm", "--registers", "8", &eight], &regions, LIMIT);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stderr(&o), format!("{eight}:1:5: register 8 out of range (registers are 0..7)\n"));
    // every example assembles
    let mut files: Vec<String> = std::fs::read_dir(examples())
        .unwrap()
        .flatten()
        .flat_map(|app| std::fs::read_dir(app.path()).unwrap().flatten().map(|f| f.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "dass"))
        .map(|p| p.display().to_string())
        .collect();
    files.sort();
    assert!(files.len() >= 7, "{files:?}");
    let mut args = vec!["dvm", "asm"];
    args.extend(files.iter().map(|s| s.as_str()));
    let o = vmf(&args, &regions, LIMIT);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert_eq!(out.lines().count(), files.len(), "{out}");
    for (line, f) in out.lines().zip(&files) {
        let n: usize = line
            .strip_prefix(&format!("{f}: "))
            .and_then(|r| r.strip_suffix(" instructions"))
            .unwrap_or_else(|| panic!("{line}"))
            .parse()
            .unwrap();
        assert!(n > 0, "{line}");
    }
}

/// Four processes write one page at once: each increments its own word 3000 times (so every increment
/// may have to take the page from another node: reservations, lease expiry, hand-over), and all of them a
/// shared counter under mutex 1. No update may be lost to a stale copy, a write-back or a hand-over, with
/// the default lease, a zero lease and a long one, in place and on copies.
#[test]
fn several_writers_on_one_page_lose_no_update() {
    let tmp = Tmp::new("contend");
    let prog = "\
; ticket: which word is this node's
lock $1
lod $0 10 $1
set 11 10
inc 11
str $0 11 $1
unlock $1
set 12 10
shl 12 $3
add 12 $64          ; own word: 64 + 8 * ticket (the same page as everything else)
set 1 $0
:loop
lod 12 2 $1
inc 2
str 12 2 $1
lock $2
lod $8 3 $1
inc 3
str $8 3 $1
unlock $2
inc 1
jlt 1 $3000 loop
barr $9 $4
lod 12 2 $1
out 2
lod $8 3 $1
out 3
hlt
";
    tmp.write("app/w.dass", prog);
    let mut nodes = String::from("[pagenodes]\n1 127.0.0.1 0\n[computenodes]\n");
    for id in 10..14 {
        nodes.push_str(&format!("{id} 127.0.0.1 w.dass 0\n"));
    }
    tmp.write("app/nodes.txt", &nodes);
    let app = tmp.path("app");
    let app = app.to_str().unwrap();
    for extra in [&[][..], &["--copy"], &["--lease-us", "0"], &["--lease-us", "2000", "--copy"], &["--interpret"]] {
        let mut args = vec!["dvm", "run", app];
        args.extend_from_slice(extra);
        let what = format!("{extra:?}");
        let v = values(&vmf(&args, &tmp.path("regions"), LIMIT), &what);
        assert_eq!(v.len(), 8, "{what}: {v:?}");
        for id in 10..14u64 {
            let mine: Vec<i64> = v.iter().filter(|x| x.0 == id).map(|x| x.1).collect();
            assert_eq!(mine, [3000, 12000], "{what}: node {id}");
        }
    }
}

/// Interactive input: each line reaches `in` as it is written, so a program answers a line before the
/// next one exists (the driver writes the second line only after it read the answer to the first), and
/// closing the input ends it. Threads of two nodes waiting in `in` are not a deadlock.
#[test]
fn in_takes_each_line_as_it_arrives() {
    use std::io::BufRead;
    let tmp = Tmp::new("interactive");
    tmp.write("app/nodes.txt", "[pagenodes]\n1 127.0.0.1 0\n[computenodes]\n2 127.0.0.1 a.dass 0\n3 127.0.0.1 a.dass 0\n");
    // each node: read a line, print it doubled, three times (six lines in all, taken in any order)
    tmp.write("app/a.dass", "set 5 $0\n:l\n in 0\n add 0 0\n out 0\n for 5 $3 l\nhlt\n");
    std::fs::create_dir_all(tmp.path("regions")).unwrap();
    let mut child = Command::new(bin())
        .args(["dvm", "run", tmp.path("app").to_str().unwrap()])
        .env("VMF_REGION_DIR", tmp.path("regions"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(out).lines() {
            if tx.send(l.unwrap()).is_err() {
                break;
            }
        }
    });
    let mut stdin = child.stdin.take().unwrap();
    let mut got = Vec::new();
    for k in 1..=6i64 {
        writeln!(stdin, "{}", 10 * k).unwrap();
        stdin.flush().unwrap();
        match rx.recv_timeout(LIMIT) {
            Ok(l) => got.push(l.split_once(": ").map(|(_, v)| v.parse::<i64>().unwrap()).unwrap()),
            Err(_) => {
                // SAFETY: a plain kill(2) of the child's process group.
                unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
                panic!("no answer to input line {k} within {LIMIT:?}: input is not taken as it arrives");
            }
        }
        assert_eq!(got.last(), Some(&(20 * k)), "answer to line {k}");
    }
    drop(stdin);
    let st = child.wait().unwrap();
    assert!(st.success(), "{st:?}");
}

/// `in` reads the lines piped into `dvm run` (or --input), in the order the nodes ask.
#[test]
fn in_reads_piped_input_and_the_input_file() {
    let tmp = Tmp::new("input");
    let app = one_node_app(&tmp, "in 0\nin 1\nadd 0 1\nout 0\nhlt\n");
    let app = app.to_str().unwrap();
    std::fs::create_dir_all(tmp.path("regions")).unwrap();
    let mut child = Command::new(bin())
        .args(["dvm", "run", app])
        .env("VMF_REGION_DIR", tmp.path("regions"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"40\n2\n").unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(values(&o, "piped"), [(2, 42)]);
    let input = tmp.write("in.txt", "-5\n7\n");
    let o = vmf(&["dvm", "run", "--input", input.to_str().unwrap(), app], &tmp.path("regions"), LIMIT);
    assert_eq!(values(&o, "--input"), [(2, 2)]);
    let o = vmf(&["dvm", "run", app], &tmp.path("regions"), LIMIT);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("trap on node 2, thread 0, at a.dass:1 (in 0): in: end of input"), "{}", stderr(&o));
}
