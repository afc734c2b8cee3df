//! Large-message calibration: `vmfabric info --calibrate` measures and caches, `vmfabric run` makes the cache
//! on first use, ranks follow it (messages of every protocol arrive intact), and a stale or broken cache
//! is ignored.
use std::process::Command;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_vmfabric")
}

#[test]
fn info_calibrate_measures_caches_and_jobs_use_the_cache_works() {
    let d = std::env::temp_dir().join(format!("vmf-calibrate-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let cache = d.join("cal.json");
    let o = Command::new(bin())
        .args(["info", "--calibrate"])
        .env("VMF_CALIBRATION", &cache)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("pipelined-16384") && out.contains("Chosen: eager <= "), "{out}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cache).unwrap()).unwrap();
    assert!(v["eager_limit"].as_u64().unwrap() >= 8192);
    assert!(v["points"].as_array().unwrap().len() >= 14);
    // `vmfabric info` reports the cached choice.
    let o = Command::new(bin()).arg("info").env("VMF_CALIBRATION", &cache).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("calibrated ("));

    // A hand-made cache that forces every protocol in turn (eager, pipelined, read, write, split): a job sends
    // sizes across all of them; `bench latency` checks every payload it receives.
    let mut forced = v.clone();
    forced["eager_limit"] = 8192.into();
    forced["chunk"] = 16384.into();
    forced["steps"] = serde_json::json!([{"from": 100000, "strategy": "read"}, {"from": 1000000, "strategy": "write"}, {"from": 3000000, "strategy": "split"}]);
    let forced_path = d.join("forced.json");
    std::fs::write(&forced_path, forced.to_string()).unwrap();
    let o = Command::new(bin())
        .args(["info"])
        .env("VMF_CALIBRATION", &forced_path)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("read from 100000 B, write from 1000000 B, split from 3000000 B"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let j = d.join("lat.json");
    let o = Command::new(bin())
        .args(["run", "-n", "2", "--quiet", bin(), "bench", "latency", "--sizes", "4096,65536,300000,2000000,4000001", "--iters", "20", "--json"])
        .arg(&j)
        .env("VMF_CALIBRATION", &forced_path)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&j).unwrap()).unwrap();
    assert_eq!(r["results"].as_array().unwrap().len(), 5);

    // First use: `vmfabric run` makes a missing cache before the job starts.
    let fresh = d.join("sub").join("fresh.json");
    let o = Command::new(bin())
        .args(["run", "-n", "2", "--quiet", bin(), "bench", "latency", "--sizes", "65536", "--iters", "10"])
        .env("VMF_CALIBRATION", &fresh)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(fresh.exists(), "vmfabric run did not calibrate on first use");

    // A broken cache is ignored (defaults), never an error.
    std::fs::write(&forced_path, "{\"eager_limit\": \"lots\"}").unwrap();
    let o = Command::new(bin()).arg("info").env("VMF_CALIBRATION", &forced_path).output().unwrap();
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("not calibrated yet"));
    std::fs::remove_dir_all(&d).unwrap();
}
