//! `vmfabric info`.
use vmf_core::Config;

fn cma_status() -> &'static str {
    let mut buf = [0u8; 8];
    let src = [1u8; 8];
    match vmf_pal::cma::read_from(std::process::id() as i32, src.as_ptr() as u64, &mut buf) {
        Ok(()) => "available (single-copy rendezvous)",
        Err(_) => "not permitted (pipelined copies through the region)",
    }
}

fn human(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    } else {
        format!("{:.1} KiB", b as f64 / 1024.0)
    }
}

/// Inside a job (`vmfabric run -n N vmfabric info`): every rank prints the channel it uses to every peer
/// and its waiting policy (and whether the job's ranks on this machine outnumber its cores).
fn in_job() -> i32 {
    let f = match vmf_core::Fabric::init() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("vmfabric info: {e}");
            return 1;
        }
    };
    let ch: Vec<String> = (0..f.size())
        .map(|p| format!("{p}:{}", f.channel(p).name()))
        .collect();
    let host = f
        .current_host()
        .map_or(String::new(), |h| format!(" on host {h}"));
    let tcp = f
        .engine()
        .tcp()
        .map_or(String::new(), |t| format!(", tcp {}", t.local_addr()));
    let w = f.engine().waiter().clone();
    let waiting = format!(
        ", waiting {} ({})",
        w.policy.name(),
        if w.oversubscribed {
            "ranks outnumber cores"
        } else {
            "a core per rank"
        }
    ) + &w.cpu.map_or(String::new(), |c| format!(", cpu {c}"));
    println!(
        "rank {}{host}: channels {}{tcp}{waiting}",
        f.rank(),
        ch.join(" ")
    );
    match f.finalize() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("vmfabric info: {e}");
            1
        }
    }
}

/// `vmfabric info --calibrate`: measure, print the curves and the choice, cache it.
pub fn calibrate() -> i32 {
    use vmf_core::calibrate;
    let cfg = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vmfabric: {e}");
            return 2;
        }
    };
    let c = match calibrate::measure(&cfg) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vmfabric info: calibration failed: {e}");
            return 1;
        }
    };
    println!("Large-message calibration ({} ms): median ping-pong half round trip, microseconds", c.took_ms);
    let mut methods: Vec<&str> = Vec::new();
    for p in &c.points {
        if !methods.contains(&p.method.as_str()) {
            methods.push(&p.method);
        }
    }
    print!("  {:>9}", "size");
    for m in &methods {
        print!("  {m:>15}");
    }
    println!();
    for &s in calibrate::SIZES {
        print!("  {:>9}", s);
        for m in &methods {
            match c.points.iter().find(|p| p.size == s && p.method == *m) {
                Some(p) => print!("  {:>15.2}", p.us),
                None => print!("  {:>15}", "-"),
            }
        }
        println!();
    }
    println!("Chosen: {}", c.path.describe());
    match calibrate::cache_path(&cfg.calibration) {
        Some(path) => match calibrate::save(&path, &c) {
            Ok(()) => println!("Cached in {} (used by every job on this host)", path.display()),
            Err(e) => {
                eprintln!("vmfabric info: cannot write {}: {e}", path.display());
                return 1;
            }
        },
        None => println!("Not cached (VMF_CALIBRATION={})", cfg.calibration),
    }
    0
}

/// Before `vmfabric run` starts a job: make this host's calibration if there is no valid cache (well under
/// a second; once per host). A failure only costs the calibrated choices: it is reported, the job runs.
pub fn calibrate_on_first_use(verbose: bool) {
    let Ok(cfg) = Config::from_env() else {
        return; // the ranks report the bad setting
    };
    if cfg.large.is_some() || !cfg.shm {
        return;
    }
    let t0 = std::time::Instant::now();
    match vmf_core::calibrate::ensure(&cfg) {
        Ok(Some(c)) if verbose => eprintln!(
            "vmfabric: calibrated large messages on this host in {} ms: {}",
            t0.elapsed().as_millis(),
            c.path.describe()
        ),
        Ok(_) => {}
        Err(e) => eprintln!("vmfabric: warning: large-message calibration failed ({e}); using the defaults"),
    }
}

pub fn run(ranks: Option<usize>) -> i32 {
    if std::env::var_os("PMI_FD").is_some() || std::env::var_os("PMI_PORT").is_some() {
        return in_job();
    }
    let cfg = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vmfabric: {e}");
            return 2;
        }
    };
    println!("vmfabric {}", env!("CARGO_PKG_VERSION"));
    println!();
    println!("Transports:");
    println!("  self   loopback to the same rank");
    println!("  shm    shared-memory rings between ranks that map the same region (same UUID)");
    println!("         large messages: process_vm_readv {}", cma_status());
    match (&cfg.large, vmf_core::calibrate::cache_path(&cfg.calibration)) {
        (Some(l), Some(p)) => println!("         calibrated ({}): {}", p.display(), l.describe()),
        (None, Some(p)) => println!(
            "         not calibrated yet ({} missing or stale; `vmfabric info --calibrate` or the next `vmfabric run` makes it): {}",
            p.display(),
            vmf_core::calibrate::LargePath::default().describe()
        ),
        (_, None) => println!("         calibration off: {}", vmf_core::calibrate::LargePath::default().describe()),
    }
    println!("  tcp    authenticated TCP between ranks that share no region (other hosts); selection per pair:");
    println!("         self, then shm, then tcp (run a job with `vmfabric run -n N vmfabric info` to see it)");
    println!();
    let ivshmem = vmf_pal::pci::ivshmem_devices();
    let region = vmf_pal::pci::region_device_of(&ivshmem).map(|d| d.address.clone());
    let bell = vmf_pal::pci::doorbell_device_of(&ivshmem).map(|d| d.address.clone());
    for d in &ivshmem {
        let mut uses = Vec::new();
        if cfg.region_path.is_empty() && cfg.ivshmem && region.as_ref() == Some(&d.address) {
            uses.push("used as the region");
        }
        if bell.as_ref() == Some(&d.address) {
            uses.push("its doorbell wakes ranks in other VMs");
        }
        println!(
            "ivshmem device: {} (PCI 1af4:1110, {}), BAR 2 {} = {}{}{}",
            d.address,
            if d.interrupts_only() {
                "ivshmem-doorbell, interrupts only"
            } else if d.doorbell {
                "ivshmem-doorbell"
            } else {
                "ivshmem-plain"
            },
            d.bar2.display(),
            human(d.size),
            if uses.is_empty() { "" } else { ", " },
            uses.join(", ")
        );
    }
    if let (true, Some(p)) = (cfg.region_path.is_empty(), cfg.region_device()) {
        println!("Region device: {} (found: ivshmem BAR 2)", p.display());
    } else if cfg.region_path.is_empty() {
        let d = std::path::Path::new(&cfg.region_dir);
        let ok = d.is_dir();
        println!(
            "Region directory: {} ({})",
            cfg.region_dir,
            if ok { "present" } else { "MISSING" }
        );
    } else {
        println!("Region device: {}", cfg.region_path);
    }
    println!();
    println!("Region memory per host (rings sized by VMF_SHM_RING_SIZE and VMF_SHM_BUDGET):");
    let counts: Vec<usize> = match ranks {
        Some(n) => vec![n],
        None => vec![2, 4, 8, 16],
    };
    for n in counts {
        let s = cfg.region_sizing(n);
        let ring = cfg.ring_size_for(n);
        let used = s.tables()
            + (n * n.saturating_sub(1)) as u64 * (ring + vmf_bb::ring::RING_CTL_SIZE as u64);
        println!(
            "  {n:>4} ranks: {} at most ({} rings of {}), region file {}",
            human(used),
            n * n.saturating_sub(1),
            human(ring),
            human(s.total())
        );
    }
    println!();
    println!("Configuration (set with environment variables):");
    let eff = cfg.effective();
    let w = eff.iter().map(|e| e.0.len()).max().unwrap_or(0);
    let wv = eff
        .iter()
        .map(|e| e.1.len().max(e.2.len()))
        .max()
        .unwrap_or(0)
        .max(5);
    println!(
        "  {:w$}  {:wv$}  {:wv$}  description",
        "name", "value", "default"
    );
    for (name, value, default, doc) in eff {
        println!("  {name:w$}  {value:wv$}  {default:wv$}  {doc}");
    }
    0
}
