//! `vmfabric vnic`: real namespaces, real TAP interfaces, unmodified ping and a TCP stream whose bytes are
//! checksummed at both ends, with and without VLB; the performance values read back and checked.
//!
//! The vnic is one per machine (namespaces vnic0..), so the tests here take turns.
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_vmfabric"))
}

fn vmf(args: &[&str]) -> Output {
    Command::new(bin()).args(args).stdin(Stdio::null()).output().expect("run vmfabric")
}

fn ok(args: &[&str]) -> String {
    let o = vmf(args);
    assert!(
        o.status.success(),
        "vmfabric {args:?} failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Root, /dev/net/tun and `ip netns` (else the test says so and passes).
fn usable() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let ip = Command::new("ip")
        .args(["netns", "list"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let ping = Command::new("ping").arg("-V").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok();
    root && ip && ping && std::path::Path::new("/dev/net/tun").exists()
}

struct Down;
impl Drop for Down {
    fn drop(&mut self) {
        let _ = vmf(&["vnic", "down", "--quiet"]);
    }
}

fn stats() -> serde_json::Value {
    serde_json::from_str(&ok(&["vnic", "stats", "--json"])).unwrap()
}

fn val(s: &serde_json::Value, node: usize, name: &str) -> u64 {
    s["nodes"][node][name].as_f64().unwrap_or_else(|| panic!("{name} missing")) as u64
}

const SERVER: &str = r#"
import socket, hashlib, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5077)); s.listen(1)
print("listening", flush=True)
c, _ = s.accept(); h = hashlib.sha256(); n = 0
while True:
    b = c.recv(1 << 16)
    if not b: break
    h.update(b); n += len(b)
print(n, h.hexdigest(), flush=True)
"#;

const CLIENT: &str = r#"
import socket, hashlib, random, sys
data = random.Random(int(sys.argv[3])).randbytes(int(sys.argv[2]))
c = socket.create_connection((sys.argv[1], 5077), timeout=60)
c.sendall(data); c.close()
print(len(data), hashlib.sha256(data).hexdigest(), flush=True)
"#;

/// Stream `bytes` from node `from` to node `to` over TCP; both ends' byte counts and SHA-256 must agree.
fn tcp_stream(from: usize, to: usize, bytes: usize, seed: u64) {
    let dst = format!("10.77.0.{}", to + 1);
    let mut server = Command::new(bin())
        .args(["vnic", "exec", &to.to_string(), "--", "python3", "-c", SERVER, &dst])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = server.stdout.take().unwrap();
    let mut first = [0u8; 10];
    std::io::Read::read_exact(&mut out, &mut first).unwrap();
    assert_eq!(&first, b"listening\n");
    let client = ok(&[
        "vnic", "exec", &from.to_string(), "--", "python3", "-c", CLIENT, &dst, &bytes.to_string(), &seed.to_string(),
    ]);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(server.wait().unwrap().success());
    assert_eq!(client.trim(), rest.trim(), "sent and received streams differ");
    assert!(client.starts_with(&bytes.to_string()), "{client}");
}

fn ping_all(nodes: usize) {
    for i in 0..nodes {
        for j in 0..nodes {
            if i != j {
                ok(&["vnic", "exec", &i.to_string(), "--", "ping", "-c", "2", "-i", "0.2", "-W", "2", "-q", &format!("10.77.0.{}", j + 1)]);
            }
        }
    }
}

fn consistent(s: &serde_json::Value, nodes: usize) {
    for i in 0..nodes {
        assert_eq!(val(s, i, "rx_packets"), val(s, i, "VLB_RX_Direct") + val(s, i, "VLB_RX_Indirect"), "node {i}");
        assert_eq!(val(s, i, "tx_packets"), val(s, i, "VLB_TX_Direct") + val(s, i, "VLB_TX_Indirect"), "node {i}");
        assert_eq!(val(s, i, "rx_errors") + val(s, i, "tx_errors"), 0, "node {i}");
    }
    let total_rx: u64 = (0..nodes).map(|i| val(s, i, "rx_packets")).sum();
    let total_tx: u64 = (0..nodes).map(|i| val(s, i, "tx_packets")).sum();
    let dropped: u64 = (0..nodes).map(|i| val(s, i, "tx_dropped") + val(s, i, "rx_dropped")).sum();
    // Packets still in flight when the snapshot was taken are few; none may be invented.
    assert!(total_rx <= total_tx && total_tx <= total_rx + dropped + 8, "tx {total_tx} rx {total_rx} dropped {dropped}");
    assert_eq!(s["total"]["rx_packets"].as_f64().unwrap() as u64, total_rx);
}

#[test]
fn four_nodes_ping_and_tcp_without_vlb() {
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !usable() {
        println!("note: skipped, the vnic needs root, /dev/net/tun, ip netns and ping");
        return;
    }
    let _down = Down;
    let up = ok(&["vnic", "up", "--nodes", "4", "--mtu", "1500"]);
    assert!(up.contains("4 nodes"), "{up}");
    // A second up refuses while this one runs.
    let again = vmf(&["vnic", "up", "--nodes", "2"]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already up"));
    ping_all(4);
    tcp_stream(0, 3, 16 << 20, 1);
    tcp_stream(2, 1, 4 << 20, 2);
    let s = stats();
    consistent(&s, 4);
    assert_eq!(val(&s, 3, "VLB_RX_Indirect"), 0, "no VLB: every packet direct");
    assert!(val(&s, 3, "rx_bytes") > 16 << 20);
    // The table names every value of Figure 32.
    let table = ok(&["vnic", "stats"]);
    for name in ["AllocatedPackets_Max", "VLB_AveragePacketsPerIRQ", "VLB_TX_LimitedByReceiver", "tx_dropped"] {
        assert!(table.contains(name), "{name} missing from\n{table}");
    }
    // Bad input: clear errors.
    let e = vmf(&["vnic", "exec", "9", "--", "true"]);
    assert!(String::from_utf8_lossy(&e.stderr).contains("outside 0..4"));
    let down = ok(&["vnic", "down"]);
    assert!(down.contains("rx_packets") && down.contains("vnic down"), "{down}");
    assert!(!std::path::Path::new("/run/netns/vnic0").exists());
    assert!(!std::path::Path::new("/dev/shm/vmfabric-vnic").exists());
}

#[test]
fn four_nodes_with_vlb_route_around_a_broken_link() {
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !usable() {
        println!("note: skipped, the vnic needs root, /dev/net/tun, ip netns and ping");
        return;
    }
    let _down = Down;
    // Node 0 and node 3 have no direct link: every frame between them evades through 1 or 2.
    ok(&[
        "vnic", "up", "--nodes", "4", "--mtu", "1500", "--no-offload", "--vlb", "--vlb-randomize",
        "--broken-links", "0-3", "--unidirectional",
    ]);
    ping_all(4);
    tcp_stream(0, 3, 8 << 20, 3);
    tcp_stream(3, 0, 2 << 20, 4);
    tcp_stream(1, 2, 2 << 20, 5);
    let s = stats();
    consistent(&s, 4);
    assert!(val(&s, 0, "VLB_TX_Direct") > 0, "node 0 still reaches 1 and 2 directly");
    assert!(val(&s, 0, "VLB_TX_Indirect") > 5000, "8 MiB at MTU 1500 is > 5000 frames, all indirect");
    assert!(val(&s, 3, "VLB_RX_Indirect") > 5000);
    assert_eq!(val(&s, 3, "VLB_LongestRoute"), 1);
    assert!(val(&s, 0, "BrokenLinkHits") > 0);
    let fwd = val(&s, 1, "Forwarded") + val(&s, 2, "Forwarded");
    assert!(fwd > 5000, "the evade nodes forwarded {fwd}");
    for i in 0..4 {
        assert_eq!(val(&s, i, "RemoteStatusReads"), 0, "unidirectional: no status word read remotely");
        assert!(val(&s, i, "MaximumPacketSize") <= 1514);
    }
}

#[test]
fn bad_options_are_refused_clearly() {
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for (args, msg) in [
        (vec!["vnic", "up", "--nodes", "1"], "outside 2..=64"),
        (vec!["vnic", "up", "--nodes", "3", "--mtu", "20"], "--mtu 20"),
        (vec!["vnic", "up", "--nodes", "3", "--broken-links", "0-7"], "outside 0..3"),
        (vec!["vnic", "up", "--nodes", "3", "--topology", "torus"], "--topology"),
        (vec!["vnic", "up", "--nodes", "3", "--vlb-next-hops", "5=1"], "outside 0..3"),
        (vec!["vnic", "up", "--nodes", "3", "--slots", "3"], "--slots 3 is not a power of two"),
        (vec!["vnic", "up", "--nodes", "3", "--slots", "32"], "--slots 32"),
    ] {
        let o = vmf(&args);
        assert!(!o.status.success(), "{args:?}");
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.contains(msg), "{args:?}: {e}");
    }
}

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
}

/// Ints per peer in the all-to-all: 256 KiB, so every node must receive at least 3 × 256 KiB.
const MPI_A2A_INTS: usize = 65536;

/// Every rank checks Allreduce, Bcast and Alltoall results itself; rank 0 prints one line. `nets` counts the
/// distinct network namespaces the ranks ran in.
const MPI_PROG: &str = r#"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#define B A2A_INTS
static int snd[16 * B], rcv[16 * B];
static unsigned char bc[8192];

/* MPICH 4.0.2's ch4:ucx finalize flushes every endpoint before its PMI barrier, and a UCX 1.13 TCP flush needs
 * the peer to answer: a rank that is still in MPI when a faster one has flushed and gone to that barrier
 * flushes towards a rank that no longer progresses, and hangs (MPICH 4.2 put the PMI barrier first). The
 * same barrier here, on Hydra's PMI socket, has every rank out of MPI calls before any rank flushes. */
static void pmi_barrier(void) {
    const char *fd = getenv("PMI_FD");
    char line[256];
    size_t n = 0;
    if (!fd) { fprintf(stderr, "no PMI_FD from Hydra\n"); exit(5); }
    int f = atoi(fd);
    if (write(f, "cmd=barrier_in\n", 15) != 15) { perror("PMI barrier_in"); exit(5); }
    while (n < sizeof line - 1 && read(f, line + n, 1) == 1 && line[n] != '\n') n++;
    line[n] = 0;
    if (strcmp(line, "cmd=barrier_out")) { fprintf(stderr, "PMI answered '%s'\n", line); exit(5); }
}

int main(int argc, char **argv) {
    int r, n, bad = 0, allbad = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (n > 16) MPI_Abort(MPI_COMM_WORLD, 2);
    struct stat st;
    long ino = stat("/proc/self/ns/net", &st) == 0 ? (long)st.st_ino : -1, inos[16];
    MPI_Allgather(&ino, 1, MPI_LONG, inos, 1, MPI_LONG, MPI_COMM_WORLD);
    int nets = 0;
    for (int i = 0; i < n; i++) {
        int seen = inos[i] < 0;
        for (int j = 0; j < i; j++) seen |= inos[j] == inos[i];
        nets += !seen;
    }
    long v = (long)(r + 1) * 1000 + r * r, sum = 0, want = 0;
    for (int i = 0; i < n; i++) want += (long)(i + 1) * 1000 + i * i;
    MPI_Allreduce(&v, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    bad += sum != want;
    if (r == 0) for (int i = 0; i < 8192; i++) bc[i] = (unsigned char)(i * 7 + 3);
    MPI_Bcast(bc, 8192, MPI_BYTE, 0, MPI_COMM_WORLD);
    for (int i = 0; i < 8192; i++) bad += bc[i] != (unsigned char)(i * 7 + 3);
    for (int j = 0; j < n; j++) for (int k = 0; k < B; k++) snd[j * B + k] = r * 10000000 + j * 1000000 + k;
    MPI_Alltoall(snd, B, MPI_INT, rcv, B, MPI_INT, MPI_COMM_WORLD);
    for (int j = 0; j < n; j++) for (int k = 0; k < B; k++) bad += rcv[j * B + k] != j * 10000000 + r * 1000000 + k;
    MPI_Allreduce(&bad, &allbad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (r == 0) {
        if (allbad == 0) printf("OK size=%d sum=%ld nets=%d\n", n, sum, nets);
        else printf("BAD size=%d sum=%ld want=%ld errors=%d nets=%d\n", n, sum, want, allbad, nets);
        fflush(stdout);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    pmi_barrier();
    MPI_Finalize();
    return allbad != 0;
}
"#;

/// Hydra's ssh launcher is called as `LAUNCHER -x HOST "/usr/bin/hydra_pmi_proxy" --control-port ...`, the
/// command meant for a remote shell; HOST 10.77.0.{K+1} is node K, so the proxy runs in namespace vnicK.
/// (Node 0's proxy is local to mpiexec, which Hydra starts itself.)
const MPI_LAUNCHER: &str = r#"#!/bin/sh
[ "$1" = -x ] && shift
host=$1; shift
case $host in 10.77.0.*) ;; *) echo "launcher: unexpected host $host" >&2; exit 1 ;; esac
echo "$host" >> "$(dirname "$0")/launched"
exec ip netns exec "vnic$(( ${host##*.} - 1 ))" sh -c "$*"
"#;

#[test]
fn mpich_over_tcp_runs_a_collective_across_the_vnic() {
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !usable() {
        println!("note: skipped, the vnic needs root, /dev/net/tun, ip netns and ping");
        return;
    }
    if !on_path("mpicc.mpich") || !on_path("mpiexec.mpich") {
        println!("note: skipped, MPICH (mpicc.mpich, mpiexec.mpich) is not installed");
        return;
    }
    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let dir = Dir(std::env::temp_dir().join(format!("vmfabric-mpich-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    std::fs::create_dir_all(&dir.0).unwrap();
    let (src, exe, launcher) = (dir.0.join("coll.c"), dir.0.join("coll"), dir.0.join("launch"));
    std::fs::write(&src, MPI_PROG.replace("A2A_INTS", &MPI_A2A_INTS.to_string())).unwrap();
    let cc = Command::new("mpicc.mpich").arg("-O2").arg("-o").arg(&exe).arg(&src).output().expect("run mpicc.mpich");
    assert!(cc.status.success(), "mpicc.mpich failed: {}", String::from_utf8_lossy(&cc.stderr));
    std::fs::write(&launcher, MPI_LAUNCHER).unwrap();
    std::fs::set_permissions(&launcher, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();

    let _down = Down;
    // MTU-sized frames: the all-to-all alone is then > 500 frames into every node.
    ok(&["vnic", "up", "--nodes", "4", "--mtu", "1500", "--no-offload"]);
    let before = stats();
    let started = std::time::Instant::now();
    // mpiexec runs in node 0 with its control address on smn0. UCX may use TCP on smn0 only (the namespaces
    // share hostname and /dev/shm, so shared memory would otherwise be chosen), and MPICH treats every
    // rank as remote.
    let o = vmf(&[
        "vnic", "exec", "0", "--", "timeout", "-k", "5", "40", "mpiexec.mpich",
        "-hosts", "10.77.0.1,10.77.0.2,10.77.0.3,10.77.0.4", "-n", "4", "-ppn", "1", "-iface", "smn0",
        "-launcher", "ssh", "-launcher-exec", launcher.to_str().unwrap(),
        "-genv", "UCX_TLS", "tcp,self", "-genv", "UCX_NET_DEVICES", "smn0", "-genv", "MPIR_CVAR_NOLOCAL", "1",
        exe.to_str().unwrap(),
    ]);
    let took = started.elapsed();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "mpiexec failed ({:?}, 124 = timed out): {out}{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(out.trim(), "OK size=4 sum=10014 nets=4", "{}", String::from_utf8_lossy(&o.stderr));
    println!("mpiexec: {} in {took:?}", out.trim());
    let mut launched: Vec<String> =
        std::fs::read_to_string(dir.0.join("launched")).unwrap().lines().map(str::to_owned).collect();
    launched.sort();
    assert_eq!(launched, ["10.77.0.2", "10.77.0.3", "10.77.0.4"], "one proxy launched into each other node");

    // (Not `consistent`: the closing connections' last frames may still be in flight.)
    let after = stats();
    for i in 0..4 {
        assert_eq!(val(&after, i, "rx_errors") + val(&after, i, "tx_errors"), 0, "node {i}");
        let (p0, p1) = (val(&before, i, "rx_packets"), val(&after, i, "rx_packets"));
        let packets = p1 - p0;
        let bytes = val(&after, i, "rx_bytes") - val(&before, i, "rx_bytes");
        println!("node {i}: rx_packets {p0} -> {p1} (+{packets}), rx_bytes +{bytes}");
        assert!(bytes >= 3 * 4 * MPI_A2A_INTS as u64, "node {i} received only {bytes} bytes during the MPI run");
        assert!(packets >= 500, "node {i} received only {packets} frames during the MPI run");
    }
    let down = ok(&["vnic", "down"]);
    assert!(down.contains("vnic down"), "{down}");
    assert!(!(0..4).any(|i| std::path::Path::new(&format!("/run/netns/vnic{i}")).exists()));
}

/// `vmfabric sweep`: a small sweep end to end — two MTUs on the vnic and on the veth baseline, an
/// IMB-format benchmark, CSV and plots — then the same sweep again, which must redo nothing.
#[test]
fn a_small_sweep_runs_end_to_end_and_resumes() {
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !usable() || !on_path("mpicc.mpich") || !on_path("mpiexec.mpich") {
        println!("note: skipped, sweeps need root, /dev/net/tun, ip netns, ping and MPICH");
        return;
    }
    let _down = Down;
    let dir = std::env::temp_dir().join(format!("vmfabric-sweep-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("small.toml");
    std::fs::write(
        &file,
        "name = \"small\"\nargs = [\"-iter\", \"20\", \"-msglog\", \"0:10\"]\nbenchmarks = [\"PingPong\", \"Sendrecv\", \"Bcast\"]\n\
         baseline = true\ntimeout_s = 120\n[parameters]\nnodes = 2\nmtu = [1500, 4000]\n",
    )
    .unwrap();
    let out = dir.join("out");
    let run = || vmf(&["sweep", file.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let o = run();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{text}");
    assert!(text.contains("4 runs (0 already done)"), "{text}");
    let res = out.join("small");
    let csv = std::fs::read_to_string(res.join("results.csv")).unwrap();
    let rows: Vec<Vec<&str>> = csv.lines().skip(1).map(|l| l.split(',').collect()).collect();
    for kind in ["smn", "baseline"] {
        for mtu in ["1500", "4000"] {
            for bench in ["PingPong", "Sendrecv", "Bcast"] {
                let n = rows.iter().filter(|r| r[1] == kind && r[4] == mtu && r[6] == bench).count();
                // sizes 0 and 2^0..2^10
                assert_eq!(n, 12, "{kind} mtu {mtu} {bench}:\n{csv}");
            }
        }
    }
    for r in &rows {
        let t: f64 = r[9].parse().unwrap();
        assert!(t > 0.0 && t.is_finite(), "{r:?}");
    }
    // The vnic runs kept their performance values; the smn runs moved real frames.
    for d in std::fs::read_dir(res.join("runs")).unwrap().flatten() {
        let name = d.file_name().to_string_lossy().into_owned();
        assert!(d.path().join("done").exists() && d.path().join("output.txt").exists(), "{name}");
        if name.starts_with("smn+") {
            let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(d.path().join("stats.json")).unwrap()).unwrap();
            assert!(s["total"]["rx_packets"].as_f64().unwrap() > 100.0, "{name}: {s}");
        }
    }
    let py_ok = ["python3", "/usr/bin/python3"].iter().any(|p| {
        Command::new(p).args(["-c", "import matplotlib"]).status().is_ok_and(|s| s.success())
    });
    if py_ok {
        for png in ["fig34_pingpong.png", "fig35_pingpong_scaling.png", "fig36_sendrecv.png", "fig37_bcast.png"] {
            let m = std::fs::metadata(res.join("plots").join(png)).unwrap_or_else(|_| panic!("{png} missing: {text}"));
            assert!(m.len() > 1000);
        }
    } else {
        println!("note: matplotlib missing, plots not checked");
    }
    // Resume: everything is done, nothing runs again.
    let stamp = std::fs::metadata(res.join("runs")).unwrap().modified().unwrap();
    let o = run();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && text.contains("4 runs (4 already done)"), "{text}");
    assert_eq!(std::fs::metadata(res.join("runs")).unwrap().modified().unwrap(), stamp);
    assert!(!std::path::Path::new("/run/netns/vnicbr").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
