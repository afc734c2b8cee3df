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
    ] {
        let o = vmf(&args);
        assert!(!o.status.success(), "{args:?}");
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.contains(msg), "{args:?}: {e}");
    }
}
