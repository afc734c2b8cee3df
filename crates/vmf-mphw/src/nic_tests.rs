//! Engine tests: real threads on a real region, asserting on every packet and on the counters.
use crate::counters::Snapshot;
use crate::hw::{parse_links, Hw, HwConfig, Mode};
use crate::nic::{Nic, NicOptions, Sent, HEADER};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn tmp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("vmf-mphw-nic-{}-{name}", std::process::id()))
}

fn v(s: &Snapshot, name: &str) -> u64 {
    s.get(name).unwrap() as u64
}

#[test]
fn direct_send_and_counters() {
    let p = tmp("direct");
    let hw = Hw::create(&p, &HwConfig::new(2, 1500 + HEADER)).unwrap();
    let mut a = Nic::new(hw.port(0).unwrap(), NicOptions::default()).unwrap();
    let mut b = Nic::new(hw.port(1).unwrap(), NicOptions::default()).unwrap();
    assert_eq!(a.send(1, b"ping"), Sent::Direct);
    assert_eq!(a.send(1, b"second"), Sent::Queued, "buffer busy: TxFIFO");
    assert_eq!(a.send(1, &[0u8; 1501]), Sent::Dropped, "beyond the mtu");
    let mut got = Vec::new();
    b.irq();
    assert_eq!(b.receive(&mut |o, _, d| { got.push((o, d.to_vec())); true }), 1);
    assert_eq!(a.poll_tx(), 1);
    b.receive(&mut |o, _, d| { got.push((o, d.to_vec())); true });
    assert_eq!(got, vec![(0, b"ping".to_vec()), (0, b"second".to_vec())]);
    let sa = Snapshot::read(&hw, 0);
    let sb = Snapshot::read(&hw, 1);
    assert_eq!(v(&sa, "tx_packets"), 2);
    assert_eq!(v(&sa, "tx_bytes"), 10);
    assert_eq!(v(&sa, "ImmediatePacketsTX"), 1);
    assert_eq!(v(&sa, "QueuedPackets_Maximum"), 1);
    assert_eq!(v(&sa, "tx_errors"), 1);
    assert_eq!(v(&sa, "MinimumPacketSize"), 4);
    assert_eq!(v(&sa, "MaximumPacketSize"), 6);
    assert_eq!(sa.get("AveragePacketSize"), Some(5.0));
    assert_eq!(v(&sb, "rx_packets"), 2);
    assert_eq!(v(&sb, "VLB_RX_Direct"), 2);
    assert_eq!(sb.get("VLB_AveragePacketsPerIRQ"), Some(2.0));
    assert!(Nic::new(hw.port(0).unwrap(), NicOptions { mtu: 4000, ..Default::default() }).is_err());
    std::fs::remove_file(p).unwrap();
}

#[test]
fn full_fifo_and_exhausted_retries_drop_and_count() {
    let p = tmp("drops");
    let mut c = HwConfig::new(3, 64 + HEADER);
    c.broken = parse_links("0-2").unwrap();
    let hw = Hw::create(&p, &c).unwrap();
    let opts = NicOptions { mtu: 64, queue_size: 3, max_tx_retries: 5, extra_signal_every: 2, ..Default::default() };
    let mut a = Nic::new(hw.port(0).unwrap(), opts).unwrap();
    // Without VLB a broken link only queues (003_* §6.2.2), then drops when the queue is full...
    let r: Vec<Sent> = (0..5).map(|_| a.send(2, b"x")).collect();
    assert_eq!(r, [Sent::Queued, Sent::Queued, Sent::Queued, Sent::Dropped, Sent::Dropped]);
    // ...and the retry budget, spent with extra signals on the way, drops the rest.
    for _ in 0..5 {
        std::thread::sleep(Duration::from_micros(20));
        assert_eq!(a.poll_tx(), 0);
    }
    assert_eq!(a.queued(), 0);
    let s = Snapshot::read(&hw, 0);
    assert_eq!(v(&s, "tx_dropped"), 5);
    assert_eq!(v(&s, "ExtraSignalsSent"), 2);
    assert_eq!(v(&s, "MaximumTxRetries"), 5);
    assert!(v(&s, "BrokenLinkHits") >= 3);
    std::fs::remove_file(p).unwrap();
}

#[test]
fn corrupt_packets_are_counted_not_delivered() {
    let p = tmp("corrupt");
    let hw = Hw::create(&p, &HwConfig::new(2, 256)).unwrap();
    let mut raw = hw.port(0).unwrap();
    let mut b = Nic::new(hw.port(1).unwrap(), NicOptions { mtu: 200, ..Default::default() }).unwrap();
    // A header naming node 40 of 2, then one whose length disagrees with the buffer's.
    let mut bad = [0u8; HEADER + 4];
    bad[0..2].copy_from_slice(&0x4e56u16.to_le_bytes());
    bad[4] = 40;
    assert!(raw.try_send(1, &[&bad]).unwrap());
    let mut n = 0;
    b.receive(&mut |_, _, _| { n += 1; true });
    bad[4] = 1;
    bad[8] = 99;
    assert!(raw.try_send(1, &[&bad]).unwrap());
    b.receive(&mut |_, _, _| { n += 1; true });
    assert_eq!(n, 0);
    assert_eq!(v(&Snapshot::read(&hw, 1), "rx_errors"), 2);
    std::fs::remove_file(p).unwrap();
}

struct Run {
    /// Per sender, packets that reached node `sink` (by sequence number).
    received: Vec<Vec<u32>>,
    stats: Vec<Snapshot>,
    elapsed: Duration,
}

/// Nodes 0..n-1 except `sink` each send `per` numbered, checksummed packets to `sink`, which services
/// its buffers only every `slow` µs; every node forwards foreign packets meanwhile.
fn fan_in(name: &str, cfg: HwConfig, opts: NicOptions, sink: usize, per: u32, slow: u64) -> Run {
    let p = tmp(name);
    let n = cfg.nodes;
    let hw = Hw::create(&p, &cfg).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let received = Arc::new(Mutex::new(vec![Vec::new(); n]));
    let start = Instant::now();
    let hs: Vec<_> = (0..n)
        .map(|me| {
            let (hw, done, received, opts) = (hw.clone(), done.clone(), received.clone(), opts.clone());
            std::thread::spawn(move || {
                let mut nic = Nic::new(hw.port(me).unwrap(), opts).unwrap();
                let mut next = 0u32;
                let mut got = 0u32;
                let total = per * (n as u32 - 1);
                let deadline = Instant::now() + Duration::from_secs(60);
                while !done.load(Ordering::Acquire) {
                    if Instant::now() > deadline {
                        let st: Vec<_> = (0..n).map(|i| Snapshot::read(&hw, i)).collect();
                        panic!("node {me}: no progress (got {got}, sent {next}, queued {}): {st:?}", nic.queued());
                    }
                    let bell = nic.port().bell();
                    let mut busy = false;
                    if me != sink && next < per {
                        let mut body = [0u8; 64];
                        body[..4].copy_from_slice(&next.to_le_bytes());
                        for (i, b) in body[4..].iter_mut().enumerate() {
                            *b = (next as usize * 7 + i + me) as u8;
                        }
                        if nic.queued() < 8 {
                            assert_ne!(nic.send(sink, &body[..4 + (next as usize % 60)]), Sent::Dropped);
                            next += 1;
                            busy = true;
                        }
                    }
                    if me == sink && slow > 0 {
                        std::thread::sleep(Duration::from_micros(slow));
                    }
                    let mut rec = Vec::new();
                    let k = nic.receive(&mut |o, q, d| {
                        let s = u32::from_le_bytes(d[..4].try_into().unwrap());
                        assert_eq!(q, s, "the packet number of {o}#{s}");
                        assert_eq!(d.len(), 4 + (s as usize % 60));
                        for (i, b) in d[4..].iter().enumerate() {
                            assert_eq!(*b, (s as usize * 7 + i + o) as u8, "payload of {o}#{s}");
                        }
                        rec.push((o, s));
                        true
                    });
                    if !rec.is_empty() {
                        got += rec.len() as u32;
                        let mut r = received.lock().unwrap();
                        for (o, s) in rec {
                            r[o].push(s);
                        }
                    }
                    busy |= k > 0;
                    busy |= nic.poll_tx() > 0;
                    if me == sink && got == total {
                        done.store(true, Ordering::Release);
                    }
                    if !busy && nic.queued() == 0 && (me == sink || next == per) {
                        if nic.port().wait(bell, Duration::from_millis(2)) {
                            nic.irq();
                        }
                    } else if !busy {
                        std::thread::yield_now();
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let elapsed = start.elapsed();
    let stats = (0..n).map(|i| Snapshot::read(&hw, i)).collect();
    let received = std::mem::take(&mut *received.lock().unwrap());
    std::fs::remove_file(p).unwrap();
    Run { received, stats, elapsed }
}

fn check_no_loss(r: &Run, sink: usize, per: u32) {
    for (o, got) in r.received.iter().enumerate() {
        if o == sink {
            assert!(got.is_empty());
            continue;
        }
        let mut g = got.clone();
        g.sort_unstable();
        assert_eq!(g, (0..per).collect::<Vec<_>>(), "packets from {o}: each exactly once");
    }
    let sum = |name| r.stats.iter().map(|s| v(s, name)).sum::<u64>();
    assert_eq!(sum("tx_dropped") + sum("rx_dropped") + sum("rx_errors") + sum("tx_errors"), 0);
    assert_eq!(sum("tx_packets"), sum("rx_packets"));
    for s in &r.stats {
        assert_eq!(v(s, "rx_packets"), v(s, "VLB_RX_Direct") + v(s, "VLB_RX_Indirect"));
        assert_eq!(v(s, "tx_packets"), v(s, "VLB_TX_Direct") + v(s, "VLB_TX_Indirect"));
    }
    // Every indirect packet was forwarded exactly once (time to live 1).
    assert_eq!(sum("VLB_TX_Indirect"), sum("VLB_RX_Indirect"));
    assert_eq!(sum("Forwarded"), sum("VLB_RX_Indirect"));
}

const PER: u32 = 3000;

#[test]
fn fan_in_without_vlb_is_direct_and_lossless() {
    let r = fan_in("novlb", HwConfig::new(4, 128), NicOptions { mtu: 64, ..Default::default() }, 3, PER, 0);
    check_no_loss(&r, 3, PER);
    assert_eq!(v(&r.stats[3], "VLB_RX_Indirect"), 0);
}

#[test]
fn fan_in_with_vlb_evades_and_is_lossless() {
    for (name, mode, randomize, free_slot) in [
        ("vlb-bi", Mode::Bidirectional, false, false),
        ("vlb-uni-rand", Mode::Unidirectional, true, true),
    ] {
        let mut cfg = HwConfig::new(5, 128);
        cfg.mode = mode;
        let opts = NicOptions {
            mtu: 64,
            vlb: true,
            vlb_randomize: randomize,
            vlb_evade_free_slot: free_slot,
            vlb_max_evade_ratio: 4,
            ..Default::default()
        };
        let r = fan_in(name, cfg, opts, 4, PER, 20);
        check_no_loss(&r, 4, PER);
        assert!(v(&r.stats[4], "VLB_RX_Indirect") > 0, "{name}: a slow sink gets evaded traffic");
        assert_eq!(v(&r.stats[4], "VLB_LongestRoute"), 1);
        eprintln!("{name}: {:?}, packets/IRQ at the sink {:.2}", r.elapsed, r.stats[4].get("VLB_AveragePacketsPerIRQ").unwrap());
        if mode == Mode::Unidirectional {
            assert!(r.stats.iter().all(|s| v(s, "RemoteStatusReads") == 0));
        }
    }
}

#[test]
fn vlb_routes_around_a_broken_link() {
    let mut cfg = HwConfig::new(4, 128);
    cfg.broken = parse_links("0-3").unwrap();
    let opts = NicOptions { mtu: 64, vlb: true, vlb_max_evade_ratio: 1, ..Default::default() };
    let r = fan_in("broken", cfg, opts, 3, 1000, 0);
    check_no_loss(&r, 3, 1000);
    // Node 0 cannot reach 3 directly: all of its packets went through 1 or 2.
    assert_eq!(v(&r.stats[0], "VLB_TX_Direct"), 0);
    assert_eq!(v(&r.stats[0], "VLB_TX_Indirect"), 1000);
}

#[test]
fn max_foreigners_stops_a_sender() {
    // Node 2 is the only way from 0 to 1 but its own buffer at 1 stays full (node 1 never receives):
    // it holds vlb_max_foreigners packets, then forbids node 0, whose further packets stay queued
    // (VLB_TX_LimitedByReceiver).
    let p = tmp("foreigners");
    let mut cfg = HwConfig::new(3, 128);
    cfg.broken = parse_links("0-1").unwrap();
    let hw = Hw::create(&p, &cfg).unwrap();
    let opts = NicOptions { mtu: 64, vlb: true, vlb_max_foreigners: 2, ..Default::default() };
    let mut a = Nic::new(hw.port(0).unwrap(), opts.clone()).unwrap();
    let mut c = Nic::new(hw.port(2).unwrap(), opts).unwrap();
    assert_eq!(c.send(1, b"own"), Sent::Direct);
    for i in 0..4u8 {
        let r = a.send(1, &[i]);
        c.receive(&mut |_, _, _| true);
        if i < 2 {
            assert_eq!(r, Sent::Indirect(2), "packet {i}");
        }
    }
    let sa = Snapshot::read(&hw, 0);
    let sc = Snapshot::read(&hw, 2);
    assert_eq!(v(&sc, "VLB_MaxSeenForeigners"), 2);
    assert!(v(&sa, "VLB_TX_LimitedByReceiver") >= 1);
    assert_eq!(a.queued(), 2, "the last two packets wait");
    std::fs::remove_file(p).unwrap();
}

#[test]
fn send_now_fails_over_a_broken_link_it_cannot_route_around() {
    let p = tmp("send-now-broken");
    let mut cfg = HwConfig::new(3, 128);
    cfg.broken = parse_links("0-1,2-1").unwrap();
    let hw = Hw::create(&p, &cfg).unwrap();
    let _n1 = hw.port(1).unwrap();
    let _n2 = hw.port(2).unwrap();
    // Without VLB: an error, not "busy" for ever.
    let mut a = Nic::new(hw.port(0).unwrap(), NicOptions { mtu: 64, ..Default::default() }).unwrap();
    let e = a.send_now(1, &[b"x"]).unwrap_err();
    assert!(e.contains("VLB is off"), "{e}");
    drop(a);
    // With VLB, but the only evade node (2) has no working link to 1 either.
    let mut a = Nic::new(hw.port(0).unwrap(), NicOptions { mtu: 64, vlb: true, ..Default::default() }).unwrap();
    let e = a.send_now(1, &[b"x"]).unwrap_err();
    assert!(e.contains("no evade node"), "{e}");
    // A working link is fine, and a busy one is "not now", not an error.
    assert!(a.send_now(2, &[b"x"]).unwrap());
    assert!(!a.send_now(2, &[b"y"]).unwrap());
    std::fs::remove_file(p).unwrap();
}

#[test]
fn corrupt_input_is_reported_once_for_transports() {
    let p = tmp("take-error");
    let hw = Hw::create(&p, &HwConfig::new(2, 256)).unwrap();
    let mut raw = hw.port(0).unwrap();
    let mut b = Nic::new(hw.port(1).unwrap(), NicOptions { mtu: 200, ..Default::default() }).unwrap();
    assert!(raw.try_send(1, &[&[0u8; 20]]).unwrap());
    b.receive(&mut |_, _, _| true);
    let (peer, what) = b.take_error().expect("an undecodable packet is an error");
    assert_eq!(peer, 0);
    assert!(what.contains("no valid header"), "{what}");
    assert!(b.take_error().is_none());
    assert!(!b.is_dead(0), "a bad packet does not kill the link; a bad status word does");
    std::fs::remove_file(p).unwrap();
}
