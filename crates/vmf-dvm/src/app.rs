//! Applications as in 004_* (§4.1.8): a folder holding `nodes.txt` and the `.dass` files it names.
//!
//! ```text
//! [pagenodes]
//! ID address mapping
//! [computenodes]
//! ID address file.dass count peers...
//! ```
//! An address is the host a node runs on: `127.0.0.1` or `localhost` (this machine), or with
//! `--hosts H` one of `host0` … `host{H-1}` (the emulated hosts). Page nodes split the shared space
//! into equal windows of `ceil(pages / page nodes)` pages: mapping m ≥ 0 keeps window m from the start,
//! m < 0 the |m|-th window counted from the end (Listing 4.1: `0` and `-1`); together they must cover
//! the space once. A compute node names its program, then how many peers it lists and the peers (IDs or
//! addresses of compute nodes; vmfabric connects every node anyway, so they are checked, not needed).
//! `#` and `;` start comments. Ranks of the job: the page nodes, then the compute nodes, in file order.
use crate::asm::{assemble, AsmErrors};
use crate::isa::Program;
use crate::space::Layout;
use crate::sync::TABLE_BYTES;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// A node's role.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    Page { mapping: i64 },
    Compute { file: String, peers: Vec<String> },
}

/// One line of nodes.txt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    pub id: u64,
    pub address: String,
    /// Emulated host index (0 without --hosts).
    pub host: usize,
    pub line: u32,
    pub role: Role,
}

/// Options of an application run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    pub page_size: usize,
    pub space: u64,
    pub registers: u32,
    pub stack_words: usize,
    /// Lease in microseconds (None: 20 µs when every page node is co-resident, else 200 µs).
    pub lease_us: Option<u64>,
    /// Emulated hosts (0: none).
    pub hosts: usize,
    /// Always work on page copies, even where home frames are mapped.
    pub copy: bool,
    /// Interpret every instruction (no compilation to native code).
    pub interpret: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            page_size: 64 << 10,
            space: 16 << 20,
            registers: 256,
            stack_words: 1 << 20,
            lease_us: None,
            hosts: 0,
            copy: false,
            interpret: false,
        }
    }
}

impl Options {
    /// As command-line arguments of `vmfabric dvm` (to pass them to the nodes).
    pub fn to_args(&self) -> Vec<String> {
        let mut a = vec![
            format!("--page-size={}", self.page_size),
            format!("--space={}", self.space),
            format!("--registers={}", self.registers),
            format!("--stack={}", self.stack_words),
        ];
        if let Some(l) = self.lease_us {
            a.push(format!("--lease-us={l}"));
        }
        if self.hosts > 0 {
            a.push(format!("--hosts={}", self.hosts));
        }
        if self.copy {
            a.push("--copy".into());
        }
        if self.interpret {
            a.push("--interpret".into());
        }
        a
    }

    /// Check the options (message names the option).
    pub fn check(&self) -> Result<(), String> {
        if !self.page_size.is_power_of_two() || !(64..=1 << 30).contains(&self.page_size) {
            return Err(format!("--page-size {} is not a power of two between 64 and 1 GiB", self.page_size));
        }
        if self.space == 0 || !self.space.is_multiple_of(self.page_size as u64) || self.space > 1 << 40 {
            return Err(format!(
                "--space {} is not a positive multiple of the page size {} (at most 1 TiB)",
                self.space, self.page_size
            ));
        }
        if self.space / self.page_size as u64 > 1 << 24 {
            return Err(format!("--space {} holds more than 2^24 pages of {} bytes", self.space, self.page_size));
        }
        if !(1..=1 << 20).contains(&self.registers) {
            return Err(format!("--registers {} is not within 1..=1048576", self.registers));
        }
        if self.stack_words > 1 << 28 {
            return Err(format!("--stack {} is more than 2^28 words", self.stack_words));
        }
        Ok(())
    }
}

/// A bad application: nodes.txt, a program, or the options.
#[derive(Debug)]
pub enum AppError {
    /// (file, line, message)
    Nodes(PathBuf, u32, String),
    Asm(AsmErrors),
    Io(PathBuf, std::io::Error),
    Options(String),
}

impl fmt::Display for AppError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AppError::Nodes(p, 0, m) => write!(f, "{}: {m}", p.display()),
            AppError::Nodes(p, l, m) => write!(f, "{}:{l}: {m}", p.display()),
            AppError::Asm(e) => write!(f, "{e}"),
            AppError::Io(p, e) => write!(f, "{}: {e}", p.display()),
            AppError::Options(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for AppError {}

/// A loaded and assembled application.
#[derive(Clone, Debug)]
pub struct App {
    pub dir: PathBuf,
    pub opts: Options,
    /// Page nodes first, then compute nodes (the job's ranks in this order).
    pub nodes: Vec<NodeSpec>,
    pub programs: HashMap<String, Program>,
}

fn host_of(addr: &str, hosts: usize) -> Option<usize> {
    if addr == "127.0.0.1" || addr == "localhost" {
        return Some(0);
    }
    let i: usize = addr.strip_prefix("host")?.parse().ok()?;
    (i < hosts && addr == format!("host{i}")).then_some(i)
}

/// Parse nodes.txt (`path` for messages).
pub fn parse_nodes(path: &Path, text: &str, hosts: usize) -> Result<Vec<NodeSpec>, AppError> {
    let bad = |l: u32, m: String| AppError::Nodes(path.to_path_buf(), l, m);
    let mut section = None;
    let mut pages = Vec::new();
    let mut computes = Vec::new();
    let mut ids: HashMap<u64, u32> = HashMap::new();
    for (i, raw) in text.lines().enumerate() {
        let ln = (i + 1) as u32;
        let line = raw.split(['#', ';']).next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if line.starts_with('[') {
            section = match line {
                "[pagenodes]" => Some(true),
                "[computenodes]" => Some(false),
                _ => return Err(bad(ln, format!("unknown section '{line}' (expected [pagenodes] or [computenodes])"))),
            };
            continue;
        }
        let Some(is_page) = section else {
            return Err(bad(ln, "a node line before any [pagenodes] or [computenodes] section".into()));
        };
        let f: Vec<&str> = line.split_whitespace().collect();
        let id: u64 = f[0].parse().map_err(|_| bad(ln, format!("node ID '{}' is not a non-negative integer", f[0])))?;
        if let Some(first) = ids.insert(id, ln) {
            return Err(bad(ln, format!("node ID {id} is already used at line {first}")));
        }
        let Some(address) = f.get(1) else {
            return Err(bad(ln, format!("node {id} has no address")));
        };
        let Some(host) = host_of(address, hosts) else {
            let names = if hosts > 0 {
                format!("127.0.0.1, localhost or host0..host{}", hosts - 1)
            } else {
                "127.0.0.1 or localhost (host0.. with --hosts)".into()
            };
            return Err(bad(ln, format!("address '{address}' of node {id} is not a host of this run ({names})")));
        };
        let role = if is_page {
            if f.len() != 3 {
                return Err(bad(ln, format!("page node {id}: expected 'ID address mapping', found {} fields", f.len())));
            }
            let mapping = f[2].parse().map_err(|_| bad(ln, format!("page node {id}: mapping '{}' is not an integer", f[2])))?;
            Role::Page { mapping }
        } else {
            if f.len() < 4 {
                return Err(bad(ln, format!("compute node {id}: expected 'ID address file.dass count peers...'")));
            }
            let count: usize = f[3]
                .parse()
                .map_err(|_| bad(ln, format!("compute node {id}: peer count '{}' is not a non-negative integer", f[3])))?;
            let peers: Vec<String> = f[4..].iter().map(|s| s.to_string()).collect();
            if peers.len() != count {
                return Err(bad(ln, format!("compute node {id}: peer count {count} but {} peers listed", peers.len())));
            }
            Role::Compute {
                file: f[2].to_string(),
                peers,
            }
        };
        let spec = NodeSpec {
            id,
            address: address.to_string(),
            host,
            line: ln,
            role,
        };
        if is_page {
            pages.push(spec);
        } else {
            computes.push(spec);
        }
    }
    if pages.is_empty() {
        return Err(bad(0, "no page nodes ([pagenodes] section)".into()));
    }
    if computes.is_empty() {
        return Err(bad(0, "no compute nodes ([computenodes] section)".into()));
    }
    for c in &computes {
        if let Role::Compute { peers, .. } = &c.role {
            for p in peers {
                let known = computes.iter().any(|o| o.address == *p || o.id.to_string() == *p);
                if !known {
                    return Err(bad(c.line, format!("compute node {}: peer '{p}' is not a compute node's ID or address", c.id)));
                }
            }
        }
    }
    pages.extend(computes);
    Ok(pages)
}

impl App {
    /// Load `dir`/nodes.txt and assemble every program it names.
    pub fn load(dir: &Path, opts: Options) -> Result<App, AppError> {
        opts.check().map_err(AppError::Options)?;
        let np = dir.join("nodes.txt");
        let text = std::fs::read_to_string(&np).map_err(|e| AppError::Io(np.clone(), e))?;
        let nodes = parse_nodes(&np, &text, opts.hosts)?;
        let mut programs = HashMap::new();
        for n in &nodes {
            if let Role::Compute { file, .. } = &n.role {
                if programs.contains_key(file) {
                    continue;
                }
                let p = dir.join(file);
                let src = std::fs::read_to_string(&p).map_err(|e| {
                    AppError::Nodes(np.clone(), n.line, format!("compute node {}: cannot read '{}': {e}", n.id, p.display()))
                })?;
                let prog = assemble(file, &src, opts.registers).map_err(AppError::Asm)?;
                programs.insert(file.clone(), prog);
            }
        }
        let app = App {
            dir: dir.to_path_buf(),
            opts,
            nodes,
            programs,
        };
        app.layout()?;
        Ok(app)
    }

    /// Where the page nodes keep the space (checks the mappings).
    pub fn layout(&self) -> Result<Layout, AppError> {
        let np = self.dir.join("nodes.txt");
        let pages = self.opts.space / self.opts.page_size as u64;
        let pn: Vec<&NodeSpec> = self.nodes.iter().filter(|n| matches!(n.role, Role::Page { .. })).collect();
        let per = pages.div_ceil(pn.len() as u64);
        let mut ranges = Vec::new();
        let mut owner: Vec<Option<u64>> = vec![None; pages as usize];
        for (rank, n) in pn.iter().enumerate() {
            let Role::Page { mapping } = n.role else { unreachable!() };
            let first = if mapping >= 0 {
                (mapping as u64).checked_mul(per)
            } else {
                pages.checked_sub(mapping.unsigned_abs().saturating_mul(per))
            };
            let Some(first) = first.filter(|&f| f < pages) else {
                return Err(AppError::Nodes(
                    np,
                    n.line,
                    format!(
                        "page node {}: mapping {mapping} is outside the shared space ({pages} pages, {} windows of {per})",
                        n.id,
                        pages.div_ceil(per)
                    ),
                ));
            };
            let count = per.min(pages - first);
            for p in first..first + count {
                if let Some(other) = owner[p as usize] {
                    return Err(AppError::Nodes(
                        np,
                        n.line,
                        format!("page node {}: mapping {mapping} overlaps page node {other}", n.id),
                    ));
                }
                owner[p as usize] = Some(n.id);
            }
            ranges.push((rank, first, count));
        }
        if let Some(p) = owner.iter().position(|o| o.is_none()) {
            return Err(AppError::Nodes(
                np,
                0,
                format!("page {p} of the shared space has no page node (the mappings must cover all {pages} pages)"),
            ));
        }
        Ok(Layout::new(self.opts.page_size, pages, &ranges, TABLE_BYTES))
    }

    /// The emulated host of each rank.
    pub fn placement(&self) -> Vec<usize> {
        self.nodes.iter().map(|n| n.host).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(t: &str, hosts: usize) -> Result<Vec<NodeSpec>, String> {
        parse_nodes(Path::new("nodes.txt"), t, hosts).map_err(|e| e.to_string())
    }

    #[test]
    fn listing_4_1_with_local_addresses() {
        let n = parse(
            "[pagenodes]\n6 127.0.0.1 0\n7 localhost -1\n[computenodes]\n9 127.0.0.1 store.dass 1 8\n8 127.0.0.1 loop.dass 0\n",
            0,
        )
        .unwrap();
        assert_eq!(n.iter().map(|x| x.id).collect::<Vec<_>>(), [6, 7, 9, 8]);
        assert_eq!(n[3].role, Role::Compute { file: "loop.dass".into(), peers: vec![] });
        let app = App {
            dir: PathBuf::from("."),
            opts: Options::default(),
            nodes: n,
            programs: HashMap::new(),
        };
        let l = app.layout().unwrap();
        assert_eq!(l.nodes[0].first, 0);
        assert_eq!(l.nodes[1].first, 128);
        assert_eq!(l.nodes[1].count, 128);
    }

    #[test]
    fn bad_nodes_files_name_the_line() {
        assert_eq!(parse("[pagenodes]\n1 25.1.1.5 0\n", 0).unwrap_err(),
            "nodes.txt:2: address '25.1.1.5' of node 1 is not a host of this run (127.0.0.1 or localhost (host0.. with --hosts))");
        assert_eq!(parse("[pagenodes]\n1 host2 0\n", 2).unwrap_err(),
            "nodes.txt:2: address 'host2' of node 1 is not a host of this run (127.0.0.1, localhost or host0..host1)");
        assert_eq!(parse("1 localhost 0\n", 0).unwrap_err(), "nodes.txt:1: a node line before any [pagenodes] or [computenodes] section");
        assert_eq!(parse("[pagenodes]\n1 localhost 0\n[computenodes]\n1 localhost a.dass 0\n", 0).unwrap_err(),
            "nodes.txt:4: node ID 1 is already used at line 2");
        assert_eq!(parse("[pagenodes]\n1 localhost 0\n[computenodes]\n2 localhost a.dass 2 1\n", 0).unwrap_err(),
            "nodes.txt:4: compute node 2: peer count 2 but 1 peers listed");
        assert_eq!(parse("[pagenodes]\n1 localhost 0\n[computenodes]\n2 localhost a.dass 1 7\n", 0).unwrap_err(),
            "nodes.txt:4: compute node 2: peer '7' is not a compute node's ID or address");
        assert_eq!(parse("[pagenodes]\n1 localhost x\n", 0).unwrap_err(), "nodes.txt:2: page node 1: mapping 'x' is not an integer");
        assert_eq!(parse("[pages]\n", 0).unwrap_err(), "nodes.txt:1: unknown section '[pages]' (expected [pagenodes] or [computenodes])");
        assert_eq!(parse("[pagenodes]\n1 localhost 0\n", 0).unwrap_err(), "nodes.txt: no compute nodes ([computenodes] section)");
    }

    #[test]
    fn mappings_must_cover_the_space_once() {
        let mk = |maps: &[i64]| {
            let mut t = String::from("[pagenodes]\n");
            for (i, m) in maps.iter().enumerate() {
                t.push_str(&format!("{} localhost {m}\n", i + 1));
            }
            t.push_str("[computenodes]\n9 localhost a.dass 0\n");
            let app = App {
                dir: PathBuf::from("d"),
                opts: Options::default(),
                nodes: parse(&t, 0).unwrap(),
                programs: HashMap::new(),
            };
            app.layout().map(|_| ()).map_err(|e| e.to_string())
        };
        assert!(mk(&[0]).is_ok());
        assert!(mk(&[0, 1, 2]).is_ok());
        assert!(mk(&[-1, -2]).is_ok());
        assert_eq!(mk(&[0, 0]).unwrap_err(), "d/nodes.txt:3: page node 2: mapping 0 overlaps page node 1");
        assert_eq!(mk(&[0, 2]).unwrap_err(), "d/nodes.txt:3: page node 2: mapping 2 is outside the shared space (256 pages, 2 windows of 128)");
        assert_eq!(mk(&[0, 0, 1]).unwrap_err(), "d/nodes.txt:3: page node 2: mapping 0 overlaps page node 1");
        assert!(mk(&[1]).is_err());
    }
}
