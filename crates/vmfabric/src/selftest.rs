//! `vmfabric selftest SCENARIO` (hidden): rank programs for the multi-process integration tests. Each
//! scenario checks its own results and exits non-zero (with a message) on any mismatch.
use clap::{Args, ValueEnum};
use std::time::Duration;
use vmf_core::{Error, Fabric, SendMode, Source, TagSel, ANY_SOURCE, ANY_TAG};

#[derive(Copy, Clone, PartialEq, Eq, ValueEnum, Debug)]
pub enum Scenario {
    /// Every rank sends random-size messages (across every protocol threshold) to every other rank.
    Random,
    /// Wildcard receives: per-source order and tag selection.
    Order,
    /// Ranks 0 and 1 exchange large messages in both directions at once.
    Bidir,
    /// Rank 0 corrupts the consumer index of its ring to rank 1 and must get an error, not a hang.
    CorruptTail,
    /// Rank 0 corrupts a record length in its ring to rank 1; rank 1 must get an error.
    CorruptRecord,
    /// Rank 0 corrupts the length of the record it left in the pair's duplex box; rank 1 must get an error.
    CorruptBox,
    /// Rank 1 dies (exit code 7) while rank 0 waits for it.
    Die,
    /// Rank 1 kills itself with SIGKILL while rank 0 waits for it.
    Kill,
    /// Every rank sleeps (for launcher tests).
    Hold,
    /// Print rank, size and the channel to every peer.
    Hello,
    /// Rank 1 waits 1 s for a message from rank 0 and reports the CPU it used meanwhile (from /proc).
    BlockCpu,
    /// Many sleep/wake cycles between all ranks (token ring plus all-to-all), to catch lost wake-ups.
    WakeStress,
    /// Exchange verified messages all-to-all for `--secs` seconds (while tests migrate ranks or knock on
    /// their ports); prints each rank's TCP address first.
    Stream,
    /// One-sided atomics under contention: every rank fetch-and-adds, CAS-increments and accumulates
    /// counters on rank 0 and the last rank `--count` times; the totals must be exact.
    RmaAtomics,
    /// A passive target (2 ranks): rank 1 computes without library calls while rank 0 gets, puts and
    /// fetch-and-adds on its window `--count` times each.
    RmaPassive,
}

#[derive(Args)]
pub struct SelftestArgs {
    scenario: Scenario,
    /// Messages per pair (random) or per sender (order).
    #[arg(long, default_value_t = 200)]
    count: usize,
    /// Seed for random sizes.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Seconds to hold (hold scenario).
    #[arg(long, default_value_t = 30)]
    secs: u64,
}

fn rng(state: &mut u64) -> u64 {
    // xorshift64*
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545F4914F6CDD1D)
}

fn fill(buf: &mut [u8], src: usize, dst: usize, idx: usize) {
    let mut s = (src as u64 * 1_000_003 + dst as u64 * 7919 + idx as u64 + 1) | 1;
    for c in buf.chunks_mut(8) {
        let v = rng(&mut s).to_le_bytes();
        c.copy_from_slice(&v[..c.len()]);
    }
}

fn die(f: &Fabric, what: String) -> ! {
    eprintln!("selftest: rank {}: FAILED: {what}", f.rank());
    std::process::exit(1)
}

pub fn run(a: SelftestArgs) -> i32 {
    let f = match Fabric::init() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("selftest: {e}");
            return 1;
        }
    };
    let r = match a.scenario {
        Scenario::Random => random(&f, a.count, a.seed),
        Scenario::Order => order(&f, a.count),
        Scenario::Bidir => bidir(&f),
        Scenario::CorruptTail => corrupt_tail(&f),
        Scenario::CorruptRecord => corrupt_record(&f),
        Scenario::CorruptBox => corrupt_record_or_box(&f, true),
        Scenario::Die | Scenario::Kill => {
            if f.rank() == 1 {
                std::thread::sleep(Duration::from_millis(200));
                if a.scenario == Scenario::Kill {
                    // SAFETY: signalling ourselves.
                    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
                }
                std::process::exit(7);
            }
            let mut b = [0u8; 8];
            let r = f.recv(&mut b, Source::Rank(1), TagSel::Any);
            eprintln!(
                "selftest: rank {}: receive from the dying rank returned {r:?}",
                f.rank()
            );
            // Wait to be stopped by the launcher, so the job's status is the dying rank's.
            std::thread::sleep(Duration::from_secs(30));
            std::process::exit(3);
        }
        Scenario::Hold => {
            std::thread::sleep(Duration::from_secs(a.secs));
            Ok(())
        }
        Scenario::BlockCpu => block_cpu(&f),
        Scenario::WakeStress => wake_stress(&f, a.count),
        Scenario::Stream => stream(&f, a.secs),
        Scenario::RmaAtomics => crate::selftest_rma::atomics(&f, a.count),
        Scenario::RmaPassive => crate::selftest_rma::passive(&f, a.count),
        Scenario::Hello => {
            let ch: Vec<String> = (0..f.size())
                .map(|p| format!("{p}:{}", f.channel(p).name()))
                .collect();
            println!(
                "hello from rank {} of {}: channels {}",
                f.rank(),
                f.size(),
                ch.join(" ")
            );
            Ok(())
        }
    };
    if let Err(e) = r {
        die(&f, e.to_string());
    }
    let rank = f.rank();
    match f.finalize() {
        Ok(()) => {
            if rank == 0 {
                println!("selftest {:?}: OK", a.scenario);
            }
            0
        }
        Err(e) => {
            eprintln!("selftest: {e}");
            1
        }
    }
}

/// Sizes that straddle every threshold: eager limit, ring fractions, chunk size.
fn pick_size(s: &mut u64, eager: usize) -> usize {
    let edges = [
        0,
        1,
        7,
        8,
        63,
        64,
        65,
        eager - 1,
        eager,
        eager + 1,
        65536,
        65537,
        262144,
        1 << 20,
        (1 << 20) + 3,
    ];
    match rng(s) % 4 {
        0 => edges[(rng(s) % edges.len() as u64) as usize],
        1 => (rng(s) % 256) as usize,
        2 => (rng(s) % (eager as u64 * 2)) as usize,
        _ => (rng(s) % (3 << 20)) as usize,
    }
}

fn random(f: &Fabric, count: usize, seed: u64) -> Result<(), Error> {
    let (me, n) = (f.rank(), f.size());
    let eager = f.eager_limit().max(2);
    // Sizes are a function of (seed, src, dst) so receivers know what to expect.
    let sizes = |src: usize, dst: usize| -> Vec<usize> {
        let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) ^ (src as u64) << 32 ^ dst as u64 | 1;
        (0..count).map(|_| pick_size(&mut s, eager)).collect()
    };
    let mut total = 0usize;
    for round in 0..2 {
        // round 0: receives posted first (expected path); round 1: sends first (unexpected path).
        let mut sbufs = Vec::new();
        let mut rbufs = Vec::new();
        for p in 0..n {
            for (i, &sz) in sizes(me, p).iter().enumerate() {
                let mut b = vec![0u8; sz];
                fill(&mut b, me, p, i + round * count);
                sbufs.push((p, b));
            }
            for &sz in &sizes(p, me) {
                rbufs.push((p, vec![0xAAu8; sz]));
            }
        }
        let mut e = f.engine();
        let mut ids = Vec::new();
        let post_recvs = |e: &mut vmf_core::EngineRef<'_>,
                          ids: &mut Vec<_>,
                          rb: &mut Vec<(usize, Vec<u8>)>|
         -> Result<(), Error> {
            for (p, b) in rb.iter_mut() {
                // SAFETY: buffers outlive the requests (all completed before they are read).
                ids.push(unsafe { e.irecv(b.as_mut_ptr(), b.len(), *p as i64, 11, 0)? });
            }
            Ok(())
        };
        if round == 0 {
            post_recvs(&mut e, &mut ids, &mut rbufs)?;
        }
        for (p, b) in &sbufs {
            // SAFETY: as above.
            ids.push(unsafe {
                e.isend(b.as_ptr(), b.len(), *p as i64, 11, 0, SendMode::Standard)?
            });
        }
        if round == 1 {
            // Let the unexpected queue fill before posting.
            for _ in 0..1000 {
                e.progress()?;
            }
            post_recvs(&mut e, &mut ids, &mut rbufs)?;
        }
        e.wait_until(vmf_core::Op::Wait, |e| ids.iter().all(|&id| e.is_done(id)))?;
        for id in ids {
            e.take(id)?;
        }
        drop(e);
        let mut idx = vec![0usize; n];
        for (p, b) in &rbufs {
            let mut want = vec![0u8; b.len()];
            fill(&mut want, *p, me, idx[*p] + round * count);
            if *b != want {
                let at = b.iter().zip(&want).position(|(x, y)| x != y).unwrap_or(0);
                die(
                    f,
                    format!(
                        "message {} from rank {p} ({} bytes) differs at byte {at}",
                        idx[*p],
                        b.len()
                    ),
                );
            }
            idx[*p] += 1;
            total += b.len();
        }
        f.barrier()?;
    }
    println!(
        "rank {me}: verified {} messages, {total} bytes",
        2 * count * n
    );
    Ok(())
}

fn order(f: &Fabric, count: usize) -> Result<(), Error> {
    let (me, n) = (f.rank(), f.size());
    if me != 0 {
        // Each sender: `count` messages, payload = (sender, seq), tag = seq % 4, every 10th large
        // (rendezvous). Nonblocking, so the receiver may take them in any tag order it likes.
        let bufs: Vec<Vec<u8>> = (0..count)
            .map(|i| {
                let mut b = vec![0u8; if i % 10 == 9 { 100_000 } else { 16 }];
                b[..8].copy_from_slice(&(me as u64).to_le_bytes());
                b[8..16].copy_from_slice(&(i as u64).to_le_bytes());
                b
            })
            .collect();
        let mut reqs = Vec::new();
        for (i, b) in bufs.iter().enumerate() {
            reqs.push(f.isend(b, 0, (i % 4) as i32)?);
        }
        f.wait_all(reqs)?;
        return f.barrier();
    }
    let mut buf = vec![0u8; 100_000];
    let parse = |b: &[u8]| {
        (
            u64::from_le_bytes(b[..8].try_into().unwrap()) as usize,
            u64::from_le_bytes(b[8..16].try_into().unwrap()) as usize,
        )
    };
    // Phase 1: rank 1's tag-2 messages by exact match must come in send order.
    let mut taken = vec![vec![false; count]; n];
    if n > 1 {
        for i in (0..count).filter(|i| i % 4 == 2) {
            let st = f.recv(&mut buf, Source::Rank(1), TagSel::Tag(2))?;
            let (src, seq) = parse(&buf);
            if st.source != 1 || st.tag != 2 || src != 1 || seq != i {
                die(
                    f,
                    format!("exact receive (1, tag 2) got seq {seq} from {src} where {i} was due"),
                );
            }
            taken[1][i] = true;
        }
    }
    // Phase 2: everything else by full wildcard; per source, sequence numbers must rise with no gaps.
    let mut next = vec![0usize; n];
    let total: usize = (n - 1) * count - taken[1].iter().filter(|&&t| t).count();
    for _ in 0..total {
        let st = f.recv(&mut buf, Source::Any, TagSel::Any)?;
        let (src, seq) = parse(&buf);
        if src != st.source || st.tag as usize != seq % 4 {
            die(
                f,
                format!(
                    "status says source {} tag {} but payload says {src}/{seq}",
                    st.source, st.tag
                ),
            );
        }
        while next[src] < count && taken[src][next[src]] {
            next[src] += 1;
        }
        if seq != next[src] {
            die(
                f,
                format!(
                    "from rank {src}: got seq {seq}, expected {} (non-overtaking violated)",
                    next[src]
                ),
            );
        }
        taken[src][seq] = true;
        next[src] += 1;
    }
    if f.iprobe(Source::Any, TagSel::Any)?.is_some() {
        die(f, "a message is left over".into());
    }
    let _ = (ANY_SOURCE, ANY_TAG);
    f.barrier()?;
    println!("rank 0: {total} wildcard receives in order");
    Ok(())
}

fn bidir(f: &Fabric) -> Result<(), Error> {
    let me = f.rank();
    if me > 1 {
        return f.barrier();
    }
    let peer = 1 - me;
    for &n in &[100_000usize, 4 << 20, 16 << 20] {
        let mut s = vec![0u8; n];
        fill(&mut s, me, peer, n);
        let mut r = vec![0u8; n];
        // Both ranks start a large send before receiving: must not deadlock.
        let sr = f.isend(&s, peer, 1)?;
        let rr = f.irecv(&mut r, Source::Rank(peer), TagSel::Tag(1))?;
        f.wait_all(vec![sr, rr])?;
        let mut want = vec![0u8; n];
        fill(&mut want, peer, me, n);
        if r != want {
            die(f, format!("{n}-byte message from rank {peer} corrupted"));
        }
    }
    f.barrier()
}

fn ring_ctl(f: &Fabric, peer: usize) -> Result<*mut u8, Error> {
    let mut e = f.engine();
    let shm = e.shm_mut().ok_or_else(|| Error::Setup {
        rank: f.rank(),
        op: vmf_core::Op::Send,
        why: "no shm transport".into(),
    })?;
    shm.debug_tx_ring(peer).map_err(|source| Error::Transport {
        rank: f.rank(),
        peer,
        op: vmf_core::Op::Send,
        source,
    })
}

fn corrupt_tail(f: &Fabric) -> Result<(), Error> {
    if f.rank() == 0 {
        let ctl = ring_ctl(f, 1)?;
        // SAFETY: `ctl` is the live control block; offset 128 is the consumer index.
        unsafe {
            (*(ctl.add(128) as *const std::sync::atomic::AtomicU64))
                .store(0xdead_beef_0000, std::sync::atomic::Ordering::SeqCst)
        };
        let b = [7u8; 200];
        let mut e = f.engine();
        for _ in 0..100_000 {
            // SAFETY: `b` outlives the process (we exit below without completing).
            let r = unsafe { e.isend(b.as_ptr(), b.len(), 1, 0, 0, SendMode::Standard) }
                .and_then(|_| e.progress());
            if let Err(err) = r {
                println!("rank 0 detected: {err}");
                drop(e);
                let _ = f.finalize();
                std::process::exit(if err.to_string().contains("corrupt") {
                    0
                } else {
                    1
                });
            }
        }
        die(f, "a corrupted consumer index went unnoticed".into());
    }
    std::thread::sleep(Duration::from_millis(1500));
    Ok(())
}

fn corrupt_record(f: &Fabric) -> Result<(), Error> {
    corrupt_record_or_box(f, false)
}

/// Rank 0 sends one message to rank 1 and then corrupts its length: in the ring (a message too large for
/// the duplex box) or in the duplex box (an 8-byte message; rank 0, the lower rank, holds the pair's box in
/// its ring's control block).
fn corrupt_record_or_box(f: &Fabric, in_box: bool) -> Result<(), Error> {
    let n = if in_box { 8 } else { 200 };
    if f.rank() == 0 {
        let ctl = ring_ctl(f, 1)?;
        // SAFETY: head at ctl+0 and capacity at ctl+8 (RingCtl), data after RING_CTL_SIZE bytes; the box
        // starts with its counter (8 bytes) and the record length (4 bytes).
        unsafe {
            let head = *(ctl as *const u64);
            f.send(&[1u8; 200][..n], 1, 0)?;
            if in_box {
                let dx = vmf_bb::ring::Ring::duplex_area(ctl);
                if *(dx as *const u64) != 1 {
                    die(
                        f,
                        "the 8-byte message did not go through the duplex box".into(),
                    );
                }
                *(dx.add(8) as *mut u32) = 0xFFFF_0000;
            } else {
                let cap = *(ctl.add(8) as *const u64);
                let rec = ctl.add(vmf_bb::ring::RING_CTL_SIZE + (head & (cap - 1)) as usize);
                *(rec.add(8) as *mut u32) = 0xFFFF_0000;
            }
        }
        return Ok(());
    }
    if f.rank() == 1 {
        std::thread::sleep(Duration::from_millis(300));
        let mut b = [0u8; 200];
        match f.recv(&mut b, Source::Rank(0), TagSel::Any) {
            Err(e) if e.to_string().contains("corrupt") => {
                println!("rank 1 detected: {e}");
                let _ = f.finalize();
                std::process::exit(0)
            }
            other => die(f, format!("corrupted record gave {other:?}")),
        }
    }
    Ok(())
}

/// utime + stime of this process in seconds, from /proc/self/stat.
fn proc_cpu_s() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = s.rfind(')').map_or("", |i| &s[i + 1..]);
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields after ')' start at field 3; utime is field 14, stime field 15.
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| f.get(i).and_then(|v| v.parse::<f64>().ok()))
        .sum();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

fn block_cpu(f: &Fabric) -> Result<(), Error> {
    match f.rank() {
        0 => {
            std::thread::sleep(Duration::from_secs(1));
            f.send(b"wake up!", 1, 5)?;
        }
        1 => {
            let cpu0 = proc_cpu_s();
            let t0 = std::time::Instant::now();
            let mut b = [0u8; 8];
            f.recv(&mut b, Source::Rank(0), TagSel::Tag(5))?;
            let (wall, cpu) = (t0.elapsed().as_secs_f64(), proc_cpu_s() - cpu0);
            if &b != b"wake up!" {
                die(f, "wrong payload".into());
            }
            println!(
                "rank 1 blocked {wall:.3} s using {cpu:.3} s of CPU ({:.2}% of a core)",
                100.0 * cpu / wall
            );
        }
        _ => {}
    }
    f.barrier()
}

fn wake_stress(f: &Fabric, count: usize) -> Result<(), Error> {
    let (me, n) = (f.rank(), f.size());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let mut tok = [0u8; 8];
    for i in 0..count as u64 {
        // Token ring: every rank but one sleeps at each step.
        if me == 0 {
            f.send(&i.to_le_bytes(), next, 1)?;
            f.recv(&mut tok, Source::Rank(prev), TagSel::Tag(1))?;
        } else {
            f.recv(&mut tok, Source::Rank(prev), TagSel::Tag(1))?;
            f.send(&tok, next, 1)?;
        }
        if u64::from_le_bytes(tok) != i {
            die(
                f,
                format!("token {} where {i} was due", u64::from_le_bytes(tok)),
            );
        }
        // A burst from everyone to everyone, received with a wildcard.
        if i % 16 == 0 {
            for p in (0..n).filter(|&p| p != me) {
                f.send(&i.to_le_bytes(), p, 2)?;
            }
            for _ in 1..n {
                f.recv(&mut tok, Source::Any, TagSel::Tag(2))?;
            }
        }
    }
    if me == 0 {
        println!(
            "wake stress: {count} rounds, {} sleeps on rank 0",
            f.engine().waiter().sleeps
        );
    }
    f.barrier()
}

fn stream(f: &Fabric, secs: u64) -> Result<(), Error> {
    let (me, n) = (f.rank(), f.size());
    if let Some(t) = f.engine().tcp() {
        println!("rank {me} tcp {}", t.local_addr());
    }
    let t0 = std::time::Instant::now();
    let mut seq = vec![0u64; n];
    let mut rounds = 0u64;
    let mut go = 1u8;
    while go == 1 {
        // Rank 0 decides when to stop, so every rank runs the same number of rounds.
        let mut flag = [0u8; 1];
        if me == 0 {
            go = (t0.elapsed().as_secs() < secs) as u8;
            for p in 1..n {
                f.send(&[go], p, 3)?;
            }
        } else {
            f.recv(&mut flag, Source::Rank(0), TagSel::Tag(3))?;
            go = flag[0];
        }
        if go == 0 {
            break;
        }
        let size = [16usize, 4096, 100_000, 1 << 20][(rounds % 4) as usize];
        let sb: Vec<Vec<u8>> = (0..n)
            .map(|p| {
                let mut b = vec![0u8; size];
                fill(&mut b, me, p, seq[p] as usize);
                b[..8].copy_from_slice(&seq[p].to_le_bytes());
                b
            })
            .collect();
        let mut rb: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; size]).collect();
        let mut reqs = Vec::new();
        for (p, b) in rb.iter_mut().enumerate().filter(|(p, _)| *p != me) {
            reqs.push(f.irecv(b, Source::Rank(p), TagSel::Tag(4))?);
        }
        for (p, b) in sb.iter().enumerate().filter(|(p, _)| *p != me) {
            reqs.push(f.isend(b, p, 4)?);
        }
        f.wait_all(reqs)?;
        for (p, b) in rb.iter().enumerate().filter(|(p, _)| *p != me) {
            let got = u64::from_le_bytes(b[..8].try_into().unwrap());
            let mut want = vec![0u8; size];
            fill(&mut want, p, me, got as usize);
            if got != seq[p] || b[8..] != want[8..] {
                die(
                    f,
                    format!(
                        "from rank {p}: message {got} where {} was due, or corrupted",
                        seq[p]
                    ),
                );
            }
        }
        for (p, s) in seq.iter_mut().enumerate() {
            if p != me {
                *s += 1;
            }
        }
        rounds += 1;
    }
    println!(
        "rank {me}: streamed {rounds} rounds, all verified, now on host {:?} named {}",
        f.current_host(),
        vmf_pal::hostid::hostname()
    );
    f.barrier()
}
