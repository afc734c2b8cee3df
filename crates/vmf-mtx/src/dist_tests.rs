//! Unit tests of the two-phase commit: one process plays three hosts (its own store, and two stores served
//! by its one-sided agent as if they were on other hosts), so every message really crosses TCP.
use super::*;
use crate::StoreOptions;
use std::path::PathBuf;
use std::sync::Arc;
use vmf_rma::agent::Agent;

const NODE: usize = 4096;

fn tmp(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("vmf-dist-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

fn creds() -> Creds {
    Creds {
        secret: [7; 16],
        job: 0x5eed,
        rank: 0,
    }
}

/// Three groups of `per` nodes each: group 0 this host's, groups 1 and 2 served by the agent (services
/// `base+1`, `base+2`). Returns the stores (kept by the test to look at and to hold locks), the services,
/// and the node→group map.
struct World {
    stores: Vec<Store>,
    services: Vec<Arc<StoreService>>,
    node_group: Vec<usize>,
    groups: Vec<GroupInfo>,
    paths: Vec<PathBuf>,
    ids: Vec<u64>,
}

impl World {
    fn new(name: &str, per: usize, base: u64) -> World {
        let agent = Agent::get_or_start("127.0.0.1".parse().unwrap(), creds(), Duration::from_micros(20)).unwrap();
        let mut stores = Vec::new();
        let mut services = Vec::new();
        let mut groups = Vec::new();
        let mut paths = Vec::new();
        let mut ids = Vec::new();
        for g in 0..3 {
            let p = tmp(&format!("{name}-{g}"));
            let opts = StoreOptions { slots: 32, ..Default::default() };
            let s = Store::create(&p, per, NODE, &opts).unwrap();
            if g > 0 {
                let svc = Arc::new(StoreService::new(s.another().unwrap(), 16));
                agent.add_service(base + g as u64, svc.clone());
                services.push(svc);
                ids.push(base + g as u64);
            }
            groups.push(GroupInfo {
                home: 0,
                addr: (g > 0).then(|| agent.addr()),
                service: base + g as u64,
            });
            stores.push(s);
            paths.push(p);
        }
        // Nodes interleaved over the groups: 0→g0, 1→g1, 2→g2, 3→g0, ...
        let node_group = (0..3 * per).map(|n| n % 3).collect();
        World { stores, services, node_group, groups, paths, ids }
    }

    fn dist(&self) -> DistStore {
        let local = self.stores[0].another().unwrap();
        DistStore::new(Some(local), &self.node_group, NODE, 0, self.groups.clone(), creds(), Duration::from_micros(50)).unwrap()
    }

    /// The 8-byte word at global `node`, `off`, read from its store by a minitransaction of its own: a
    /// coordinator does not wait for its COMMIT messages, so a participant may still hold the items' locks
    /// (and apply the writes) when the commit has returned; a locked read waits for that, a plain load
    /// would not.
    fn word(&self, node: usize, off: usize) -> u64 {
        let (g, i) = (node % 3, node / 3);
        let s = &self.stores[g];
        let mut t = s.begin();
        let r = t.read(s, i, off, 8).unwrap();
        assert_eq!(t.commit(s, Mode::Blocking).unwrap(), Outcome::Committed);
        u64::from_le_bytes(t.read_result(r).unwrap().try_into().unwrap())
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if let Some(a) = Agent::running() {
            for id in &self.ids {
                a.remove_service(*id);
            }
        }
        for p in &self.paths {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[test]
fn one_phase_and_two_phase_commits_apply_all_or_nothing_across_hosts() {
    let w = World::new("sem", 2, 100);
    let d = w.dist();
    // One remote host only: one message.
    let mut t = d.begin();
    t.write(&d, 1, 0, &11u64.to_le_bytes()).unwrap();
    t.write(&d, 4, 8, &12u64.to_le_bytes()).unwrap();
    assert_eq!(t.commit(&d, Mode::Try).unwrap(), Outcome::Committed);
    assert_eq!((w.word(1, 0), w.word(4, 8)), (11, 12));
    // Every host: local, group 1 and group 2; reads come back.
    t.reset();
    t.compare(&d, 1, 0, &11u64.to_le_bytes()).unwrap();
    let r = t.read(&d, 4, 8, 8).unwrap();
    t.write(&d, 0, 0, &21u64.to_le_bytes()).unwrap();
    t.write(&d, 2, 16, &22u64.to_le_bytes()).unwrap();
    t.write(&d, 5, 100, b"across").unwrap();
    assert_eq!(t.commit(&d, Mode::Blocking).unwrap(), Outcome::Committed);
    assert_eq!(t.read_result(r).unwrap(), &12u64.to_le_bytes());
    assert_eq!((w.word(0, 0), w.word(2, 16)), (21, 22));
    let s2 = &w.stores[2];
    let mut rd = s2.begin();
    let ri = rd.read(s2, 1, 100, 6).unwrap();
    assert_eq!(rd.commit(s2, Mode::Blocking).unwrap(), Outcome::Committed);
    assert_eq!(rd.read_result(ri).unwrap(), b"across");
    // A remote compare fails: nothing written anywhere, the global index named, reads filled.
    t.reset();
    t.compare(&d, 0, 0, &21u64.to_le_bytes()).unwrap();
    t.compare(&d, 2, 16, &99u64.to_le_bytes()).unwrap();
    let r = t.read(&d, 1, 0, 8).unwrap();
    t.write(&d, 0, 0, &31u64.to_le_bytes()).unwrap();
    t.write(&d, 1, 0, &32u64.to_le_bytes()).unwrap();
    assert_eq!(t.commit(&d, Mode::Blocking).unwrap(), Outcome::CompareFailed(1));
    assert_eq!(t.failed_item(), Some(1));
    assert_eq!(t.read_result(r).unwrap(), &11u64.to_le_bytes());
    assert_eq!((w.word(0, 0), w.word(1, 0)), (21, 11));
    // A local compare fails: the other hosts' reads are still filled, nothing is written.
    t.reset();
    t.compare(&d, 3, 0, &5u64.to_le_bytes()).unwrap();
    let r = t.read(&d, 1, 0, 8).unwrap();
    t.write(&d, 2, 16, &40u64.to_le_bytes()).unwrap();
    assert_eq!(t.commit(&d, Mode::Blocking).unwrap(), Outcome::CompareFailed(0));
    assert_eq!(t.read_result(r).unwrap(), &11u64.to_le_bytes());
    assert_eq!(w.word(2, 16), 22);
    // A prepared transaction re-committed with new values.
    t.reset();
    t.compare(&d, 1, 0, &11u64.to_le_bytes()).unwrap();
    t.write(&d, 1, 0, &12u64.to_le_bytes()).unwrap();
    t.write(&d, 0, 8, &1u64.to_le_bytes()).unwrap();
    assert_eq!(t.commit(&d, Mode::Try).unwrap(), Outcome::Committed);
    t.set_compare(0, &12u64.to_le_bytes()).unwrap();
    t.set_write(0, &13u64.to_le_bytes()).unwrap();
    t.set_write(1, &2u64.to_le_bytes()).unwrap();
    assert_eq!(t.commit(&d, Mode::Try).unwrap(), Outcome::Committed);
    assert_eq!((w.word(1, 0), w.word(0, 8)), (13, 2));
    assert!(t.set_write(0, b"short").is_err());
    // Bad items are refused when added.
    assert!(t.write(&d, 6, 0, b"x").is_err(), "no node 6");
    assert!(t.write(&d, 1, NODE - 2, b"xyz").is_err(), "beyond the node");
    assert!(t.read(&d, 2, 0, 0).is_err(), "0 bytes");
    for s in &w.services {
        assert_eq!(s.in_doubt(), 0);
    }
}

#[test]
fn a_held_remote_lock_fails_a_try_commit_and_delays_a_blocking_one() {
    let w = World::new("lock", 1, 200);
    let d = w.dist();
    // Hold node 1's stripe (group 1) through a prepared transaction of a process on that host.
    let holder = w.stores[1].another().unwrap();
    let mut h = holder.begin();
    h.write(&holder, 0, 0, &5u64.to_le_bytes()).unwrap();
    assert_eq!(h.prepare(&holder, Mode::Try, false).unwrap(), Outcome::Committed);
    let mut t = d.begin();
    t.write(&d, 0, 0, &1u64.to_le_bytes()).unwrap();
    t.write(&d, 1, 0, &6u64.to_le_bytes()).unwrap();
    assert_eq!(t.commit(&d, Mode::Try).unwrap(), Outcome::LockFailed);
    assert_eq!(w.word(0, 0), 0, "the local part was not applied");
    let rel = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        h.finish(&holder, true).unwrap();
    });
    let t0 = Instant::now();
    assert_eq!(t.commit(&d, Mode::Blocking).unwrap(), Outcome::Committed);
    assert!(t0.elapsed() >= Duration::from_millis(20));
    rel.join().unwrap();
    assert_eq!((w.word(0, 0), w.word(1, 0)), (1, 6));
}

#[test]
fn a_coordinator_that_leaves_with_a_prepared_transaction_is_aborted_and_its_locks_freed() {
    let w = World::new("gone", 1, 300);
    let agent = Agent::running().unwrap();
    let mut c = ServiceClient::connect(agent.addr(), &creds(), 0, Duration::from_micros(50)).unwrap();
    let mut p = Vec::new();
    p.extend_from_slice(&9u64.to_le_bytes());
    p.extend_from_slice(&0u32.to_le_bytes());
    p.extend_from_slice(&1u32.to_le_bytes());
    item_hdr(&mut p, K_WRITE, 0, 0, 8);
    p.extend_from_slice(&77u64.to_le_bytes());
    let a = c.call(301, OP_PREPARE, &[&p], 8).unwrap();
    assert_eq!(u32::from_le_bytes(a[..4].try_into().unwrap()), V_YES);
    assert_eq!(w.services[0].in_doubt(), 1);
    // Prepared: the stripe is locked against everyone else.
    let other = w.stores[1].another().unwrap();
    let mut t = other.begin();
    t.write(&other, 0, 0, &1u64.to_le_bytes()).unwrap();
    assert_eq!(t.commit(&other, Mode::Try).unwrap(), Outcome::LockFailed);
    // A second prepare of the same transaction id on the session is refused; malformed ones too.
    assert!(c.call(301, OP_PREPARE, &[&p], 8).is_err());
    drop(c);
    let t0 = Instant::now();
    while w.services[0].in_doubt() != 0 {
        assert!(t0.elapsed() < Duration::from_secs(5), "the prepared transaction was never aborted");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(w.word(1, 0), 0, "an aborted transaction wrote");
    assert_eq!(t.commit(&other, Mode::Try).unwrap(), Outcome::Committed);
    // Malformed payloads: refused, the connection stays usable.
    let mut c = ServiceClient::connect(agent.addr(), &creds(), 0, Duration::from_micros(50)).unwrap();
    assert!(c.call(301, OP_PREPARE, &[&p[..20]], 8).is_err());
    let mut bad = p.clone();
    bad[16] = 9; // unknown item kind
    assert!(c.call(301, OP_PREPARE, &[&bad], 8).is_err());
    let mut far = p.clone();
    far[24..32].copy_from_slice(&(NODE as u64).to_le_bytes()); // offset beyond the node
    assert!(c.call(301, OP_PREPARE, &[&far], 8).is_err());
    assert!(c.call(301, OP_COMMIT, &[&5u64.to_le_bytes()], 0).is_err(), "no such prepared transaction");
    assert!(c.call(301, 9, &[], 0).is_err(), "unknown operation");
    let a = c.call(301, OP_PREPARE, &[&p], 8).unwrap();
    assert_eq!(u32::from_le_bytes(a[..4].try_into().unwrap()), V_YES);
    c.call(301, OP_COMMIT, &[&9u64.to_le_bytes()], 0).unwrap();
    assert_eq!(w.word(1, 0), 77);
}

#[test]
fn a_bank_over_three_hosts_keeps_its_total_under_concurrent_transfers() {
    const ACCOUNTS: usize = 4; // per node
    const START: u64 = 1000;
    let w = World::new("bank", 2, 400);
    // Each thread is its own participant (a store attachment holds one slot): its own DistStore.
    let d = Arc::new(w.dist());
    let nodes = d.nodes();
    {
        let mut t = d.begin();
        for n in 0..nodes {
            for a in 0..ACCOUNTS {
                t.write(&d, n, a * 64, &START.to_le_bytes()).unwrap();
            }
        }
        assert_eq!(t.commit(&d, Mode::Blocking).unwrap(), Outcome::Committed);
    }
    let total = START * (nodes * ACCOUNTS) as u64;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut hs = Vec::new();
    for k in 0..3u64 {
        let d = w.dist();
        hs.push(std::thread::spawn(move || {
            let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (k + 1);
            let mut next = || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            let mut done = 0;
            for _ in 0..300 {
                let (n1, a1) = ((next() % nodes as u64) as usize, (next() % ACCOUNTS as u64) as usize);
                let (n2, a2) = ((next() % nodes as u64) as usize, (next() % ACCOUNTS as u64) as usize);
                if (n1, a1) == (n2, a2) {
                    continue;
                }
                loop {
                    let mut t = d.begin();
                    let r1 = t.read(&d, n1, a1 * 64, 8).unwrap();
                    let r2 = t.read(&d, n2, a2 * 64, 8).unwrap();
                    assert_eq!(t.commit(&d, Mode::Blocking).unwrap(), Outcome::Committed);
                    let v1 = u64::from_le_bytes(t.read_result(r1).unwrap().try_into().unwrap());
                    let v2 = u64::from_le_bytes(t.read_result(r2).unwrap().try_into().unwrap());
                    let amt = next() % (v1 + 1);
                    let mut u = d.begin();
                    u.compare(&d, n1, a1 * 64, &v1.to_le_bytes()).unwrap();
                    u.compare(&d, n2, a2 * 64, &v2.to_le_bytes()).unwrap();
                    u.write(&d, n1, a1 * 64, &(v1 - amt).to_le_bytes()).unwrap();
                    u.write(&d, n2, a2 * 64, &(v2 + amt).to_le_bytes()).unwrap();
                    match u.commit(&d, Mode::Blocking).unwrap() {
                        Outcome::Committed => {
                            done += 1;
                            break;
                        }
                        Outcome::CompareFailed(_) => continue,
                        Outcome::LockFailed => unreachable!("a blocking commit"),
                    }
                }
            }
            done
        }));
    }
    // The checker: a read-only transaction over every account sees the total at every instant.
    let checker = {
        let (d, stop) = (w.dist(), stop.clone());
        std::thread::spawn(move || {
            let mut checks = 0;
            while !stop.load(Ordering::Relaxed) {
                let mut t = d.begin();
                let rs: Vec<usize> = (0..nodes).flat_map(|n| (0..ACCOUNTS).map(move |a| (n, a))).map(|(n, a)| t.read(&d, n, a * 64, 8).unwrap()).collect();
                assert_eq!(t.commit(&d, Mode::Blocking).unwrap(), Outcome::Committed);
                let sum: u64 = rs.iter().map(|&r| u64::from_le_bytes(t.read_result(r).unwrap().try_into().unwrap())).sum();
                assert_eq!(sum, total, "the checker saw money appear or vanish");
                checks += 1;
            }
            checks
        })
    };
    let moved: usize = hs.into_iter().map(|h| h.join().unwrap()).sum();
    stop.store(true, Ordering::Relaxed);
    let checks = checker.join().unwrap();
    assert!(moved > 500 && checks > 0, "{moved} transfers, {checks} checks");
    let mut sum = 0;
    for n in 0..nodes {
        for a in 0..ACCOUNTS {
            sum += w.word(n, a * 64);
        }
    }
    assert_eq!(sum, total);
    for s in &w.services {
        assert_eq!(s.in_doubt(), 0);
    }
}
