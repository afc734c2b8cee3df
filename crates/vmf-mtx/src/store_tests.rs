//! Unit tests of the store and minitransactions: semantics, validation, contention between threads (each
//! with its own slot), and crash recovery by re-running this test binary as a child that dies mid-commit.
use super::*;
use std::path::PathBuf;
use std::sync::Arc;

fn tmp(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("vmf-mtx-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

fn u64at(s: &Store, node: usize, off: usize) -> u64 {
    let mut b = [0u8; 8];
    s.peek(node, off, &mut b).unwrap();
    u64::from_le_bytes(b)
}

#[test]
fn commit_applies_writes_only_when_every_compare_holds_works() {
    let p = tmp("sem");
    let s = Store::create(&p, 3, 4096, &StoreOptions::default()).unwrap();
    let mut t = s.begin();
    t.write(&s, 0, 0, &7u64.to_le_bytes()).unwrap();
    t.write(&s, 2, 4000, b"hello").unwrap();
    assert_eq!(t.commit(&s, Mode::Try).unwrap(), Outcome::Committed);
    assert_eq!(u64at(&s, 0, 0), 7);
    t.reset();
    // Second compare fails: nothing written, reads filled, the failing item named.
    t.compare(&s, 0, 0, &7u64.to_le_bytes()).unwrap();
    t.compare(&s, 2, 4000, b"world").unwrap();
    let r = t.read(&s, 2, 4000, 5).unwrap();
    t.write(&s, 1, 8, b"x").unwrap();
    assert_eq!(t.commit(&s, Mode::Blocking).unwrap(), Outcome::CompareFailed(1));
    assert_eq!(t.failed_item(), Some(1));
    assert_eq!(t.read_result(r).unwrap(), b"hello");
    let mut b = [0u8; 1];
    s.peek(1, 8, &mut b).unwrap();
    assert_eq!(b, [0]);
    // A multi-stripe, multi-node write through the log.
    t.reset();
    let big: Vec<u8> = (0..3000).map(|i| i as u8).collect();
    t.compare(&s, 0, 0, &7u64.to_le_bytes()).unwrap();
    t.write(&s, 1, 100, &big).unwrap();
    t.write(&s, 0, 0, &8u64.to_le_bytes()).unwrap();
    assert_eq!(t.commit(&s, Mode::Try).unwrap(), Outcome::Committed);
    let mut out = vec![0u8; 3000];
    s.peek(1, 100, &mut out).unwrap();
    assert_eq!(out, big);
    assert_eq!(u64at(&s, 0, 0), 8);
    drop(s);
    // Another process (here: a second open) sees the same data.
    let s2 = Store::open(&p).unwrap();
    assert_eq!(u64at(&s2, 0, 0), 8);
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn bad_arguments_and_corrupt_files_are_errors_fails() {
    let p = tmp("bad");
    assert!(matches!(Store::create(&p, 0, 8, &StoreOptions::default()), Err(Error::InvalidArgument(_))));
    let o = StoreOptions { stripe: 12, ..Default::default() };
    assert!(matches!(Store::create(&p, 1, 8, &o), Err(Error::InvalidArgument(_))));
    let s = Store::create(&p, 2, 64, &StoreOptions::default()).unwrap();
    // The same path again: refused, the store is untouched.
    assert!(matches!(Store::create(&p, 2, 64, &StoreOptions::default()), Err(Error::Io { .. })));
    let mut t = s.begin();
    assert!(matches!(t.write(&s, 2, 0, b"x"), Err(Error::InvalidArgument(_))));
    assert!(matches!(t.write(&s, 1, 60, b"12345"), Err(Error::InvalidArgument(_))));
    assert!(matches!(t.read(&s, 0, 0, 0), Err(Error::InvalidArgument(_))));
    assert!(matches!(t.compare(&s, 0, usize::MAX, b"x"), Err(Error::InvalidArgument(_))));
    drop(s);
    // Not a store; a store whose header lies about its layout.
    let q = tmp("notastore");
    std::fs::write(&q, vec![1u8; 8192]).unwrap();
    assert!(matches!(Store::open(&q), Err(Error::Corrupt(_))));
    std::fs::remove_file(&q).unwrap();
    let seg = vmf_bb::segment::Segment::open_existing(&p).unwrap();
    seg.at::<AtomicU64>(H_NODE_BYTES).unwrap().store(1 << 30, Ordering::Relaxed);
    assert!(matches!(Store::open(&p), Err(Error::Corrupt(_))));
    seg.at::<AtomicU64>(H_NODE_BYTES).unwrap().store(64, Ordering::Relaxed);
    // A lock word naming no slot: the commit reports it instead of waiting forever.
    let s = Store::open(&p).unwrap();
    s.lock(0).unwrap().store(9999, Ordering::Relaxed);
    let mut t = s.begin();
    t.write(&s, 0, 0, b"x").unwrap();
    assert!(matches!(t.commit(&s, Mode::Blocking), Err(Error::Corrupt(_))));
    std::fs::remove_file(&p).unwrap();
}

/// Threads, each attached with its own slot, increment counters by compare-and-write under no, medium and
/// high contention; transfers between accounts keep their sum; nothing is lost.
#[test]
fn concurrent_commits_lose_no_update_and_keep_invariants_works() {
    let p = Arc::new(tmp("conc"));
    let nthreads = 4usize;
    let iters = 3000u64;
    let _s = Store::create(&p, 2, 64 * 64, &StoreOptions::default()).unwrap();
    for contention in ["none", "medium", "high"] {
        let hs: Vec<_> = (0..nthreads)
            .map(|me| {
                let p = p.clone();
                std::thread::spawn(move || {
                    let s = Store::open(&p).unwrap();
                    let mut t = s.begin();
                    let mut idx = me;
                    let mut failures = 0u64;
                    for _ in 0..iters {
                        let c = match contention {
                            "none" => me,
                            "medium" => {
                                idx = (idx + 1) % nthreads;
                                idx
                            }
                            _ => 0,
                        };
                        loop {
                            let v = u64at(&s, 0, c * 64);
                            t.reset();
                            t.compare(&s, 0, c * 64, &v.to_le_bytes()).unwrap();
                            t.write(&s, 0, c * 64, &(v + 1).to_le_bytes()).unwrap();
                            match t.commit(&s, if me % 2 == 0 { Mode::Try } else { Mode::Blocking }).unwrap() {
                                Outcome::Committed => break,
                                _ => failures += 1,
                            }
                        }
                    }
                    failures
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let s = Store::open(&p).unwrap();
        let total: u64 = (0..nthreads).map(|c| u64at(&s, 0, c * 64)).sum();
        assert_eq!(total, nthreads as u64 * iters, "{contention} contention lost updates");
        let mut t = s.begin();
        for c in 0..nthreads {
            t.write(&s, 0, c * 64, &0u64.to_le_bytes()).unwrap();
        }
        assert_eq!(t.commit(&s, Mode::Blocking).unwrap(), Outcome::Committed);
    }
    // Transfers across two nodes (multi-item, logged) against read-only audits.
    let hs: Vec<_> = (0..nthreads)
        .map(|me| {
            let p = p.clone();
            std::thread::spawn(move || {
                let s = Store::open(&p).unwrap();
                let mut t = s.begin();
                for i in 0..iters {
                    if me == 0 {
                        t.reset();
                        let a = t.read(&s, 0, 0, 8).unwrap();
                        let b = t.read(&s, 1, 64 * 10, 8).unwrap();
                        assert_eq!(t.commit(&s, Mode::Blocking).unwrap(), Outcome::Committed);
                        let x = u64::from_le_bytes(t.read_result(a).unwrap().try_into().unwrap()) as i64;
                        let y = u64::from_le_bytes(t.read_result(b).unwrap().try_into().unwrap()) as i64;
                        assert_eq!(x + y, 0, "an audit saw half a transfer");
                        continue;
                    }
                    let amt = (i % 7) as i64 - 3;
                    loop {
                        let x = u64at(&s, 0, 0) as i64;
                        let y = u64at(&s, 1, 64 * 10) as i64;
                        t.reset();
                        t.compare(&s, 0, 0, &(x as u64).to_le_bytes()).unwrap();
                        t.compare(&s, 1, 64 * 10, &(y as u64).to_le_bytes()).unwrap();
                        t.write(&s, 0, 0, &((x - amt) as u64).to_le_bytes()).unwrap();
                        t.write(&s, 1, 64 * 10, &((y + amt) as u64).to_le_bytes()).unwrap();
                        if t.commit(&s, Mode::Blocking).unwrap() == Outcome::Committed {
                            break;
                        }
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    std::fs::remove_file(&*p).unwrap();
}

#[test]
fn try_mode_fails_on_a_held_lock_and_slots_run_out_fails() {
    let p = tmp("try");
    let o = StoreOptions { slots: 2, ..Default::default() };
    let a = Store::create(&p, 1, 128, &o).unwrap();
    let b = Store::open(&p).unwrap();
    assert!(matches!(Store::open(&p), Err(Error::NoSlot(2))));
    // b holds stripe 0 (as if mid-commit): a's Try commit fails, touching nothing.
    b.lock(0).unwrap().store(b.slot() as u64 + 1, Ordering::Relaxed);
    let mut t = a.begin();
    t.write(&a, 0, 0, b"zz").unwrap();
    assert_eq!(t.commit(&a, Mode::Try).unwrap(), Outcome::LockFailed);
    b.lock(0).unwrap().store(0, Ordering::Relaxed);
    assert_eq!(t.commit(&a, Mode::Try).unwrap(), Outcome::Committed);
    drop(b);
    let _c = Store::open(&p).unwrap(); // b's slot is free again
    std::fs::remove_file(&p).unwrap();
}

// ---------------------------------------------------------------- crash recovery

/// Run in a child process (this test binary again): commit a two-node transfer on the store named by
/// VMF_MTX_CHILD and die at crash point VMF_MTX_CRASH (0: loop forever, to be killed).
#[test]
fn crash_child_entry() {
    let Ok(path) = std::env::var("VMF_MTX_CHILD") else { return };
    let point: u8 = std::env::var("VMF_MTX_CRASH").unwrap().parse().unwrap();
    let s = Store::open(std::path::Path::new(&path)).unwrap();
    CRASH_AT.store(point, Ordering::Relaxed);
    let mut t = s.begin();
    loop {
        let x = u64at(&s, 0, 0);
        let y = u64at(&s, 1, 200);
        t.reset();
        t.compare(&s, 0, 0, &x.to_le_bytes()).unwrap();
        t.compare(&s, 1, 200, &y.to_le_bytes()).unwrap();
        // Two writes (so the log is used), one spanning stripes.
        let mut blob = [0u8; 100];
        blob[..8].copy_from_slice(&(y + 1).to_le_bytes());
        blob[92..].copy_from_slice(&(y + 1).to_le_bytes());
        t.write(&s, 0, 0, &(x.wrapping_sub(1)).to_le_bytes()).unwrap();
        t.write(&s, 1, 200, &blob).unwrap();
        let _ = t.commit(&s, Mode::Blocking).unwrap();
    }
}

fn child(path: &std::path::Path, point: u8) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "store::tests::crash_child_entry", "--nocapture", "--test-threads=1"])
        .env("VMF_MTX_CHILD", path)
        .env("VMF_MTX_CRASH", point.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// Node 0's word + node 1's word stay 0 (every transfer moves one unit); the tail of node 1's blob is
/// the same value as its head, written in the same commit (a torn write set shows as a difference).
fn consistent(s: &Store) -> (u64, u64) {
    let mut t = s.begin();
    let a = t.read(s, 0, 0, 8).unwrap();
    let b = t.read(s, 1, 200, 100).unwrap();
    assert_eq!(t.commit(s, Mode::Blocking).unwrap(), Outcome::Committed);
    let x = u64::from_le_bytes(t.read_result(a).unwrap().try_into().unwrap());
    let blob = t.read_result(b).unwrap();
    let y = u64::from_le_bytes(blob[..8].try_into().unwrap());
    let seq = u64::from_le_bytes(blob[92..].try_into().unwrap());
    assert_eq!(x.wrapping_add(y), 0, "half a transfer is visible (x={x}, y={y})");
    assert_eq!(y, seq, "the two parts of one write set differ (y={y}, seq={seq})");
    (y, seq)
}

#[test]
fn a_process_dying_at_each_point_of_a_commit_leaves_the_store_consistent_works() {
    let p = tmp("crash");
    let s = Store::create(&p, 2, 4096, &StoreOptions::default()).unwrap();
    // 1: locks held, nothing written -> nothing applied, locks recovered.
    // 2: log written, COMMITTING, nothing applied -> the recoverer applies all of it.
    // 3: first write applied -> the recoverer applies the rest.
    for (point, want) in [(1u8, 0u64), (2, 1), (3, 2)] {
        let st = child(&p, point).wait().unwrap();
        assert_eq!(st.code(), Some(9), "the child should die at point {point}");
        let (y, _) = consistent(&s);
        assert_eq!(y, want, "after a death at point {point}");
    }
    // kill -9 at random moments of a commit loop.
    let mut last = 2;
    for k in 0..15u64 {
        let mut c = child(&p, 0);
        std::thread::sleep(std::time::Duration::from_millis(20 + (k * 37) % 60));
        c.kill().unwrap();
        c.wait().unwrap();
        let (y, _) = consistent(&s);
        assert!(y >= last, "a committed transfer was lost");
        last = y;
    }
    assert!(last > 20, "the children committed almost nothing ({last})");
    // Every dead slot was recovered on the way (or is now).
    s.recover_dead().unwrap();
    std::fs::remove_file(&p).unwrap();
}

/// A prepared transaction re-committed with new values (set_compare / set_write), its items checked once;
/// the lean path trusts the bounds only for the store they were checked against.
#[test]
fn prepared_transactions_take_new_values_and_check_lengths_works() {
    let p = tmp("prepared");
    let s = Store::create(&p, 2, 256, &StoreOptions::default()).unwrap();
    let mut t = s.begin();
    t.compare(&s, 1, 64, &0u64.to_le_bytes()).unwrap();
    t.write(&s, 1, 64, &0u64.to_le_bytes()).unwrap();
    for v in 0..100u64 {
        t.set_compare(0, &v.to_le_bytes()).unwrap();
        t.set_write(0, &(v + 1).to_le_bytes()).unwrap();
        assert_eq!(t.commit(&s, Mode::Try).unwrap(), Outcome::Committed);
    }
    assert_eq!(u64at(&s, 1, 64), 100);
    // A stale expected value fails the compare and writes nothing.
    t.set_compare(0, &5u64.to_le_bytes()).unwrap();
    t.set_write(0, &999u64.to_le_bytes()).unwrap();
    assert_eq!(t.commit(&s, Mode::Try).unwrap(), Outcome::CompareFailed(0));
    assert_eq!(u64at(&s, 1, 64), 100);
    assert!(t.set_compare(0, b"short").is_err());
    assert!(t.set_write(1, &1u64.to_le_bytes()).is_err());
    assert!(t.set_compare(3, &1u64.to_le_bytes()).is_err());
    // The same transaction against another store (more nodes, different mapping) takes the checked path
    // and still commits there correctly.
    let p2 = tmp("prepared2");
    let s2 = Store::create(&p2, 3, 4096, &StoreOptions::default()).unwrap();
    t.set_compare(0, &0u64.to_le_bytes()).unwrap();
    t.set_write(0, &1u64.to_le_bytes()).unwrap();
    assert_eq!(t.commit(&s2, Mode::Try).unwrap(), Outcome::Committed);
    assert_eq!(u64at(&s2, 1, 64), 1);
    // A transaction whose item lies beyond a smaller store fails there with an error, not a wild write.
    let mut big = s2.begin();
    big.write(&s2, 2, 4000, &1u64.to_le_bytes()).unwrap();
    assert!(big.commit(&s, Mode::Try).is_err());
    drop((s, s2));
    std::fs::remove_file(&p).unwrap();
    std::fs::remove_file(&p2).unwrap();
}

#[test]
fn leases_are_kept_only_once_a_second_kernel_attaches() {
    use std::time::Duration;
    let p = tmp("kernels");
    let a = Store::create(&p, 1, 4096, &StoreOptions { lease: Duration::from_millis(200), ..Default::default() }).unwrap();
    let b = Store::open(&p).unwrap();
    assert!(!a.multi_kernel() && !b.multi_kernel(), "one kernel: no leases");
    let lease = |s: &Store, slot: usize| s.slot_word(slot, S_LEASE).load(Ordering::Relaxed);
    let before = lease(&a, a.slot());
    std::thread::sleep(Duration::from_millis(120));
    let mut t = a.begin();
    t.write(&a, 0, 0, &1u64.to_le_bytes()).unwrap();
    assert_eq!(t.commit(&a, Mode::Try).unwrap(), Outcome::Committed);
    assert_eq!(lease(&a, a.slot()), before, "a commit in a one-kernel store reads no clock");
    // A participant of another kernel (a VM's process) attaches: leases are in force from now on, and a
    // participant that had not renewed its own gets a full lease from then.
    let vm = Store::open_in(&p, a.kernel ^ 0x5a5a).unwrap();
    assert!(a.multi_kernel() && vm.multi_kernel());
    assert!(vm.alive(a.slot()), "the local participant is judged by the time leases came into force");
    let mut t = a.begin();
    t.write(&a, 0, 8, &2u64.to_le_bytes()).unwrap();
    assert_eq!(t.commit(&a, Mode::Blocking).unwrap(), Outcome::Committed);
    assert!(lease(&a, a.slot()) > before, "commits now renew the lease");
    // The VM's participant stops renewing: once its lease is over, the local ones presume it dead.
    assert!(a.alive(vm.slot()));
    std::thread::sleep(Duration::from_millis(260));
    assert!(!a.alive(vm.slot()), "a foreign participant whose lease ran out is presumed dead");
    drop(b);
    let _ = std::fs::remove_file(&p);
}
