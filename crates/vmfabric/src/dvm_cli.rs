//! `vmfabric dvm`: the distributed virtual machine (docs/dvm.md).
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};
use vmf_dvm::app::{App, Options};
use vmf_dvm::node::{run_node, NodeEnd};
use vmf_dvm::vm::{Input, StreamInput};

#[derive(Args)]
pub struct DvmArgs {
    #[command(subcommand)]
    cmd: DvmCmd,
}

#[derive(Args, Clone)]
struct AppOpts {
    /// Page size in bytes (K/M suffixes allowed; a power of two).
    #[arg(long, default_value = "64K", value_parser = parse_size)]
    page_size: u64,
    /// Size of the shared address space in bytes (K/M/G suffixes allowed).
    #[arg(long, default_value = "16M", value_parser = parse_size)]
    space: u64,
    /// Registers of every thread.
    #[arg(long, default_value_t = 256)]
    registers: u32,
    /// Stack of every thread, in 8-byte words.
    #[arg(long, default_value_t = 1 << 20)]
    stack: usize,
    /// Page lease in microseconds: how long a holder keeps a page someone else waits for (default: 20
    /// when every page node is co-resident, else 200).
    #[arg(long)]
    lease_us: Option<u64>,
    /// Emulated hosts (network namespaces; needs root): addresses host0..host{H-1} in nodes.txt.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=250))]
    hosts: Option<u16>,
    /// Work on copies of pages even where the page node's memory is mapped (the path between hosts).
    #[arg(long)]
    copy: bool,
    /// Interpret every instruction instead of compiling the programs to native code (Cranelift).
    #[arg(long)]
    interpret: bool,
    /// Print each compute node's instruction and page counters on stderr at the end.
    #[arg(long)]
    stats: bool,
    /// Lines `in` instructions read, in the order the nodes ask (default: what is typed or piped to
    /// `dvm run`, line by line as it arrives; nothing when it runs in the background of a terminal).
    #[arg(long)]
    input: Option<PathBuf>,
    /// (between `dvm run` and its nodes) --input is a file that grows until FILE.end exists.
    #[arg(long, hide = true, requires = "input")]
    input_stream: bool,
}

#[derive(Subcommand)]
enum DvmCmd {
    /// Run the application in APPDIR (nodes.txt and its .dass files) as a vmfabric job.
    Run {
        appdir: PathBuf,
        #[command(flatten)]
        opts: AppOpts,
    },
    /// Assemble and verify .dass files (errors as file:line:column: message).
    Asm {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Registers of every thread.
        #[arg(long, default_value_t = 256)]
        registers: u32,
    },
    /// One node of a running application (started by `dvm run`).
    #[command(hide = true)]
    Node {
        appdir: PathBuf,
        #[command(flatten)]
        opts: AppOpts,
    },
}

fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mul) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 1u64 << 10),
        Some((i, 'M' | 'm')) => (&t[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|v| v.checked_mul(mul))
        .ok_or_else(|| format!("'{s}' is not a size (a number, optionally with K, M or G)"))
}

fn options(o: &AppOpts) -> Options {
    Options {
        page_size: o.page_size.min(usize::MAX as u64) as usize,
        space: o.space,
        registers: o.registers,
        stack_words: o.stack,
        lease_us: o.lease_us,
        hosts: o.hosts.map_or(0, usize::from),
        copy: o.copy,
        interpret: o.interpret,
    }
}

fn load(dir: &Path, o: &AppOpts) -> Result<App, i32> {
    App::load(dir, options(o)).map_err(|e| {
        eprintln!("vmfabric dvm: {e}");
        2
    })
}

fn node_args(o: &AppOpts, input: Option<&Path>, stream: bool) -> Vec<String> {
    let mut a = options(o).to_args();
    if o.stats {
        a.push("--stats".into());
    }
    if let Some(i) = input {
        a.push(format!("--input={}", i.display()));
        if stream {
            a.push("--input-stream".into());
        }
    }
    a
}

/// The input for the nodes: --input as it is, else standard input forwarded line by line, as it arrives,
/// into a temporary file the nodes follow (`in` waits for its line; the file's `.end` marker says the
/// input is over). Returns the file, whether it is such a stream, and a guard removing the files. A
/// terminal is read only while `dvm run` is its foreground job (a background read would stop it).
fn input_file(o: &AppOpts) -> Result<(Option<PathBuf>, bool, Option<TempInput>), String> {
    if let Some(p) = &o.input {
        std::fs::metadata(p).map_err(|e| format!("--input {}: {e}", p.display()))?;
        return Ok((Some(p.clone()), false, None));
    }
    // SAFETY: isatty, tcgetpgrp and getpgrp only inspect descriptor 0 and this process.
    if unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) != libc::getpgrp() } {
        return Ok((None, false, None));
    }
    let p = std::env::temp_dir().join(format!("vmf-dvm-input-{}", std::process::id()));
    let end = vmf_dvm::vm::StreamInput::end_marker(&p);
    let _ = std::fs::remove_file(&end);
    let mut f = std::fs::File::create(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    let guard = TempInput(p.clone(), end.clone());
    std::thread::spawn(move || {
        use std::io::{BufRead, Write};
        let mut stdin = std::io::stdin().lock();
        let mut line = Vec::new();
        loop {
            line.clear();
            match stdin.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if f.write_all(&line).and_then(|_| f.flush()).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = std::fs::File::create(&end);
    });
    Ok((Some(p), true, Some(guard)))
}

/// Removes the forwarded input and its end marker.
struct TempInput(PathBuf, PathBuf);

impl Drop for TempInput {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let _ = std::fs::remove_file(&self.1);
    }
}

pub fn run(a: DvmArgs) -> i32 {
    match a.cmd {
        DvmCmd::Asm { files, registers } => {
            let mut code = 0;
            for f in files {
                let name = f.display().to_string();
                match std::fs::read_to_string(&f) {
                    Err(e) => {
                        eprintln!("{name}: {e}");
                        code = 2;
                    }
                    Ok(src) => match vmf_dvm::asm::assemble(&name, &src, registers) {
                        Ok(p) => println!("{name}: {} instructions", p.code.len()),
                        Err(e) => {
                            eprintln!("{e}");
                            code = 2;
                        }
                    },
                }
            }
            code
        }
        DvmCmd::Run { appdir, opts } => {
            let app = match load(&appdir, &opts) {
                Ok(a) => a,
                Err(c) => return c,
            };
            let Ok(exe) = std::env::current_exe() else {
                eprintln!("vmfabric dvm: cannot find the vmfabric executable");
                return 2;
            };
            let (input, stream, _guard) = match input_file(&opts) {
                Ok(x) => x,
                Err(e) => {
                    eprintln!("vmfabric dvm: {e}");
                    return 2;
                }
            };
            let mut args = vec!["dvm".to_string(), "node".to_string(), appdir.display().to_string()];
            args.extend(node_args(&opts, input.as_deref(), stream));
            let mut ro = vmf_launch::RunOptions::new(app.nodes.len(), exe.display().to_string(), args);
            ro.quiet = true;
            ro.region_dir = crate::default_region_dir(None);
            ro.hosts = app.opts.hosts;
            if app.opts.hosts > 0 {
                ro.placement = Some(app.placement());
            }
            match vmf_launch::run(&ro) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("vmfabric dvm: {e}");
                    2
                }
            }
        }
        DvmCmd::Node { appdir, opts } => {
            let app = match load(&appdir, &opts) {
                Ok(a) => a,
                Err(c) => return c,
            };
            let fab = match vmf_core::Fabric::init() {
                Ok(f) => f,
                Err(e) => {
                    eprintln!("vmfabric dvm: {e}");
                    return 2;
                }
            };
            let me = &app.nodes[fab.rank().min(app.nodes.len() - 1)];
            let input = match &opts.input {
                Some(p) if opts.input_stream => Input::Stream(StreamInput::new(p.clone())),
                Some(p) => match std::fs::read_to_string(p) {
                    Ok(t) => Input::Lines(t.lines().map(str::to_string).collect()),
                    Err(e) => {
                        eprintln!("vmfabric dvm: --input {}: {e}", p.display());
                        std::process::exit(2);
                    }
                },
                None => Input::Lines(Vec::new()),
            };
            let code = match run_node(&fab, &app, input) {
                Ok(NodeEnd::Page) => 0,
                Ok(NodeEnd::Compute(r)) => {
                    if opts.stats {
                        let p = &r.pages;
                        let med = |v: &[u32]| {
                            vmf_dvm::space::median_us(v).map_or("-".to_string(), |m| format!("{m:.2} us ({} samples)", v.len()))
                        };
                        eprintln!(
                            "dvm: node {}: {}, {} instructions interpreted, {} page acquisitions ({} waited), {} fetches, {} write-backs, {} given to waiters; median take {}, median fetch {}",
                            me.id,
                            if r.compiled { "compiled" } else { "interpreted" },
                            r.interpreted,
                            p.acquires,
                            p.waits,
                            p.fetches,
                            p.writebacks,
                            p.releases_for_waiter,
                            med(&p.take_ns),
                            med(&p.fetch_ns)
                        );
                    }
                    0
                }
                Err(e) => {
                    eprintln!("vmfabric dvm: {e}");
                    // leave at once: the launcher ends the job and names this rank
                    std::process::exit(3);
                }
            };
            let _ = fab.finalize();
            code
        }
    }
}
