//! `vmfabric mtx create|check` and `vmfabric bench mtx|barrier`: a persistent store that a later process
//! attaches to, refusal of an existing path and bad sizes, and the benchmarks' JSON.
use std::process::Command;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_vmfabric")
}

#[test]
fn mtx_create_check_and_a_later_process_attaches_works() {
    let p = std::env::temp_dir().join(format!("vmf-mtx-cli-{}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    let o = Command::new(bin()).args(["mtx", "create"]).arg(&p).args(["--nodes", "3", "--bytes", "1000"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("3 nodes of 1000 bytes"));
    // Not over an existing store.
    let o = Command::new(bin()).args(["mtx", "create"]).arg(&p).args(["--nodes", "1", "--bytes", "8"]).output().unwrap();
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("cannot create"));
    // This process attaches and commits; `check` sees the same store.
    let s = vmf_mtx::Store::open(&p).unwrap();
    let mut t = s.begin();
    t.write(&s, 2, 992, &7u64.to_le_bytes()).unwrap();
    assert_eq!(t.commit(&s, vmf_mtx::Mode::Try).unwrap(), vmf_mtx::Outcome::Committed);
    drop(s);
    let o = Command::new(bin()).args(["mtx", "check"]).arg(&p).output().unwrap();
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("0 dead participant(s) recovered"));
    let s = vmf_mtx::Store::open(&p).unwrap();
    let mut b = [0u8; 8];
    s.peek(2, 992, &mut b).unwrap();
    assert_eq!(u64::from_le_bytes(b), 7);
    std::fs::remove_file(&p).unwrap();
    // Bad sizes are refused with the reason.
    let o = Command::new(bin()).args(["mtx", "create"]).arg(&p).args(["--nodes", "0", "--bytes", "8"]).output().unwrap();
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("memory nodes"));
    let o = Command::new(bin()).args(["mtx", "check", "/nonexistent/store"]).output().unwrap();
    assert!(!o.status.success());
}

#[test]
fn bench_mtx_and_barrier_write_their_json_works() {
    let d = std::env::temp_dir().join(format!("vmf-mtx-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    for (kind, key) in [("mtx", "updates_per_s"), ("barrier", "barriers_per_s")] {
        let j = d.join(format!("{kind}.json"));
        let o = Command::new(bin())
            .args(["run", "--quiet", "-n", "2", bin(), "bench", kind, "--iters", "2000", "--json"])
            .arg(&j)
            .output()
            .unwrap();
        assert!(o.status.success(), "{kind}: {}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&j).unwrap()).unwrap();
        assert_eq!(v["benchmark"], kind);
        let rows = v["results"].as_array().unwrap();
        assert_eq!(rows.len(), if kind == "mtx" { 6 } else { 3 });
        assert!(rows.iter().all(|r| r[key].as_f64().unwrap() > 0.0 && r["ranks"] == 2));
    }
    std::fs::remove_dir_all(&d).unwrap();
}
