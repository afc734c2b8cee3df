//! `vmfabric bench migrate`: ranks stream sequence-numbered, checksummed messages of mixed sizes
//! (8 B to 5 MiB) while ranks are moved between emulated hosts; everything received is verified.
//!
//! Run inside a multi-host job: `vmfabric run --hosts 3 -n 4 vmfabric bench migrate`. Every round is one
//! or two exchanges in the shape `--traffic` names (each message per ordered pair carries its own sequence
//! number and is received in order per source with one tag, so MPI's non-overtaking rule is what is
//! checked):
//! - `all-to-all`: one message per ordered pair;
//! - `ring`: each rank sends to the next and receives from the previous;
//! - `collective`: everyone sends to rank 0, then rank 0 sends to everyone (a gather and a broadcast,
//!   all traffic through one root, as a collective loop does);
//! - `mixed`: the three in turn.
//!
//! After every few rounds the next rank in turn moves to the next host (so every rank eventually returns
//! to its original host) while the others are already sending to it. The pause of a migration is the
//! time from its start until the first message over a new channel is delivered to a peer.
use clap::ValueEnum;
use std::time::Instant;
use vmf_core::{Error, Fabric, SendMode};

const SIZES: &[usize] = &[8, 512, 4096, 65536, 300_000, 2 << 20, 8, 64, 5 << 20, 1024];
const HDR: usize = 24;

fn checksum(b: &[u8]) -> u64 {
    let mut h: u64 = 0x9E3779B97F4A7C15;
    for c in b.chunks(8) {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        h = (h ^ u64::from_le_bytes(w))
            .wrapping_mul(0x100000001b3)
            .rotate_left(29);
    }
    h
}

fn fill(buf: &mut [u8], src: usize, seq: u64) {
    let mut x = (src as u64 + 1).wrapping_mul(0x9E3779B97F4A7C15) ^ seq;
    for c in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let v = x.to_le_bytes();
        c.copy_from_slice(&v[..c.len()]);
    }
}

/// Traffic during the migrations.
#[derive(Copy, Clone, PartialEq, Eq, ValueEnum, Debug, Default)]
pub enum Traffic {
    /// One message per ordered pair every round.
    #[default]
    AllToAll,
    /// Each rank sends to the next and receives from the previous.
    Ring,
    /// Gather to rank 0, then broadcast from it.
    Collective,
    /// The three in turn.
    Mixed,
}

impl Traffic {
    fn name(self) -> &'static str {
        match self {
            Traffic::AllToAll => "all-to-all",
            Traffic::Ring => "ring",
            Traffic::Collective => "collective",
            Traffic::Mixed => "mixed",
        }
    }

    /// The exchanges of `round` for rank `me` of `n`: (destinations, sources) per phase.
    fn phases(self, round: usize, me: usize, n: usize) -> Vec<(Vec<usize>, Vec<usize>)> {
        let others: Vec<usize> = (0..n).filter(|&p| p != me).collect();
        let t = match self {
            Traffic::Mixed => [Traffic::AllToAll, Traffic::Ring, Traffic::Collective][round % 3],
            t => t,
        };
        match t {
            Traffic::Ring => vec![(vec![(me + 1) % n], vec![(me + n - 1) % n])],
            Traffic::Collective if me == 0 => vec![(vec![], others.clone()), (others, vec![])],
            Traffic::Collective => vec![(vec![0], vec![]), (vec![], vec![0])],
            _ => vec![(others.clone(), others)],
        }
    }
}

#[derive(Default, Debug, Clone, Copy)]
struct Counts {
    messages: u64,
    bytes: u64,
    lost: u64,
    duplicated: u64,
    reordered: u64,
    corrupt: u64,
}

pub fn run(migrations: usize, traffic: Traffic, json: Option<std::path::PathBuf>) -> i32 {
    let f = match Fabric::init() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("vmfabric bench migrate: {e}");
            return 1;
        }
    };
    if f.host_count() < 2 || f.size() < 2 {
        eprintln!("vmfabric bench migrate: run it in a multi-host job: vmfabric run --hosts 3 -n 4 vmfabric bench migrate");
        return 2;
    }
    match measure(&f, migrations, traffic, json.as_deref()) {
        Ok(ok) => {
            let _ = f.finalize();
            if ok {
                0
            } else {
                1
            }
        }
        Err(e) => {
            eprintln!("vmfabric bench migrate: rank {}: {e}", f.rank());
            f.abort(1, "migration benchmark failed")
        }
    }
}

fn measure(
    f: &Fabric,
    migrations: usize,
    traffic: Traffic,
    json: Option<&std::path::Path>,
) -> Result<bool, Error> {
    let (me, n) = (f.rank(), f.size());
    let hosts = f.host_count();
    let interval = 3;
    let rounds = migrations * interval + interval;
    let mut next_seq = vec![0u64; n];
    let mut expect = vec![0u64; n];
    let mut c = Counts::default();
    let mut sbufs: Vec<Vec<u8>> = vec![Vec::new(); n];
    let mut rbufs: Vec<Vec<u8>> = vec![Vec::new(); n];
    let tag = 77;
    f.barrier()?;
    let t0 = Instant::now();
    let mut done_migrations = 0;
    for round in 0..rounds {
        let size = SIZES[round % SIZES.len()].max(HDR);
        for (dests, srcs) in traffic.phases(round, me, n) {
            exchange(f, &dests, &srcs, size, tag, &mut next_seq, &mut sbufs, &mut rbufs)?;
            for &p in &srcs {
                verify(&rbufs[p], p, &mut expect[p], &mut c);
            }
        }
        // Migrations: every `interval` rounds the next rank moves to the next host.
        if round % interval == interval - 1 && done_migrations < migrations {
            let mover = done_migrations % n;
            done_migrations += 1;
            if mover == me {
                let cur = f.current_host().unwrap_or(0);
                let to = (cur + 1) % hosts;
                f.migrate_to(to)?;
            }
        }
    }
    f.barrier()?;
    let wall = t0.elapsed();
    // Gather counts and pause samples on rank 0; a migration's pause is its earliest sample.
    let samples = f.engine().take_pause_samples();
    let mine = [
        c.messages,
        c.bytes,
        c.lost,
        c.duplicated,
        c.reordered,
        c.corrupt,
    ];
    let mut all = c;
    let mut all_samples = samples.clone();
    if me == 0 {
        for p in 1..n {
            let mut b = [0u8; 48];
            f.recv(&mut b, vmf_core::Source::Rank(p), vmf_core::TagSel::Tag(78))?;
            let v: Vec<u64> = b
                .chunks(8)
                .map(|x| u64::from_le_bytes(x.try_into().unwrap()))
                .collect();
            all.messages += v[0];
            all.bytes += v[1];
            all.lost += v[2];
            all.duplicated += v[3];
            all.reordered += v[4];
            all.corrupt += v[5];
            let mut pb = vec![0u8; 16 * (migrations + 1) * n];
            let st = f.recv(
                &mut pb,
                vmf_core::Source::Rank(p),
                vmf_core::TagSel::Tag(79),
            )?;
            all_samples.extend(pb[..st.count].chunks(16).map(|x| {
                (
                    u64::from_le_bytes(x[..8].try_into().unwrap()),
                    f64::from_le_bytes(x[8..].try_into().unwrap()),
                )
            }));
        }
    } else {
        let b: Vec<u8> = mine.iter().flat_map(|x| x.to_le_bytes()).collect();
        f.send(&b, 0, 78)?;
        let pb: Vec<u8> = samples
            .iter()
            .flat_map(|(t, p)| t.to_le_bytes().into_iter().chain(p.to_le_bytes()))
            .collect();
        f.send(&pb, 0, 79)?;
    }
    let mut by_migration: std::collections::BTreeMap<u64, f64> = std::collections::BTreeMap::new();
    for (t0, p) in all_samples {
        let e = by_migration.entry(t0).or_insert(f64::MAX);
        *e = e.min(p);
    }
    let all_pauses: Vec<f64> = by_migration.into_values().collect();
    if me != 0 {
        return Ok(true);
    }
    let in_order = all_pauses;
    let mut all_pauses = in_order.clone();
    all_pauses.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let pct = |q: f64| -> f64 {
        if all_pauses.is_empty() {
            return 0.0;
        }
        let i = ((all_pauses.len() as f64 - 1.0) * q).round() as usize;
        all_pauses[i]
    };
    let ok = all.lost == 0
        && all.duplicated == 0
        && all.reordered == 0
        && all.corrupt == 0
        && all_pauses.len() == migrations;
    println!(
        "migrate ({}): {n} ranks on {hosts} hosts, {} migrations, {} messages ({:.1} MiB) in {:.2} s: lost {}, duplicated {}, \
         reordered {}, corrupt {}; pause median {:.3} ms, p99 {:.3} ms{}",
        traffic.name(),
        all_pauses.len(),
        all.messages,
        all.bytes as f64 / (1u64 << 20) as f64,
        wall.as_secs_f64(),
        all.lost,
        all.duplicated,
        all.reordered,
        all.corrupt,
        pct(0.5),
        pct(0.99),
        if ok { "" } else { "  FAILED" }
    );
    if let Some(path) = json {
        let doc = serde_json::json!({"benchmark": "migrate", "traffic": traffic.name(), "migrations": all_pauses.len(), "messages": all.messages,
            "bytes": all.bytes, "lost": all.lost, "duplicated": all.duplicated, "reordered": all.reordered,
            "corrupt": all.corrupt, "pause_ms_median": pct(0.5), "pause_ms_p99": pct(0.99),
            "pauses_ms": in_order, "ranks": n, "hosts": hosts, "wall_s": wall.as_secs_f64()});
        let _ = std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap() + "\n");
    }
    Ok(ok)
}

/// One exchange: a message to each of `dests` (with the next sequence number of that pair), one from
/// each of `srcs`, all in flight at once.
#[allow(clippy::too_many_arguments)]
fn exchange(
    f: &Fabric,
    dests: &[usize],
    srcs: &[usize],
    size: usize,
    tag: i32,
    next_seq: &mut [u64],
    sbufs: &mut [Vec<u8>],
    rbufs: &mut [Vec<u8>],
) -> Result<(), Error> {
    let me = f.rank();
    for &p in dests {
        let b = &mut sbufs[p];
        b.resize(size, 0);
        fill(&mut b[HDR..], me, next_seq[p]);
        let ck = checksum(&b[HDR..]);
        b[..8].copy_from_slice(&next_seq[p].to_le_bytes());
        b[8..16].copy_from_slice(&(me as u64).to_le_bytes());
        b[16..24].copy_from_slice(&ck.to_le_bytes());
        next_seq[p] += 1;
    }
    for &p in srcs {
        rbufs[p].resize(size, 0);
    }
    let mut e = f.engine();
    let mut ids = Vec::with_capacity(dests.len() + srcs.len());
    // SAFETY: buffers outlive the requests (completed below).
    unsafe {
        for &p in srcs {
            ids.push(e.irecv(rbufs[p].as_mut_ptr(), size, p as i64, tag, 0)?);
        }
        for &p in dests {
            ids.push(e.isend(sbufs[p].as_ptr(), size, p as i64, tag, 0, SendMode::Standard)?);
        }
    }
    e.wait_until(vmf_core::Op::Wait, |e| ids.iter().all(|&id| e.is_done(id)))?;
    for id in ids {
        e.take(id)?;
    }
    Ok(())
}

/// Check one received message from `p` against the sequence number expected next from it.
fn verify(b: &[u8], p: usize, expect: &mut u64, c: &mut Counts) {
    let seq = u64::from_le_bytes(b[..8].try_into().unwrap());
    let src = u64::from_le_bytes(b[8..16].try_into().unwrap()) as usize;
    let ck = u64::from_le_bytes(b[16..24].try_into().unwrap());
    c.messages += 1;
    c.bytes += b.len() as u64;
    if src != p || ck != checksum(&b[HDR..]) {
        c.corrupt += 1;
    }
    if seq == *expect {
        *expect += 1;
    } else if seq < *expect {
        c.duplicated += 1;
    } else {
        c.reordered += 1;
        c.lost += seq - *expect;
        *expect = seq + 1;
    }
}
