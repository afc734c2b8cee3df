//! Spawn requests (MPI_Comm_spawn / MPI_Comm_spawn_multiple): what a command's info keys mean, where its
//! program is and on which host its processes start. Everything is checked before any process of the
//! request starts, so a bad request starts nothing and is answered with why.
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use vmf_pmi::SpawnCmd;

/// One command of a spawn request, checked and resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Prepared {
    /// The program to execute (resolved path).
    pub exe: PathBuf,
    /// The program as the request named it (argv[0] and messages).
    pub name: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Number of processes.
    pub count: usize,
    /// Working directory (info `wdir`); None: the launcher's.
    pub wdir: Option<PathBuf>,
    /// Hosts to start on, round robin (info `host`/`hosts`); None: the spawning rank's host.
    pub hosts: Option<Vec<usize>>,
}

/// Check `cmd` and resolve its program and info keys. `hosts` are the names and addresses of the
/// emulated hosts (empty without `--hosts`); `cwd` is the launcher's working directory.
pub(crate) fn prepare(cmd: &SpawnCmd, hosts: &[(String, String)], cwd: &Path) -> Result<Prepared, String> {
    // MPI_Info has one value per key; should a client repeat one, the last counts.
    let info = |key: &str| {
        cmd.info
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    };
    let wdir = match info("wdir") {
        None => None,
        Some(w) => {
            let d = cwd.join(w);
            match std::fs::metadata(&d) {
                Ok(m) if m.is_dir() => Some(d),
                Ok(_) => {
                    return Err(format!(
                        "the working directory {w} (info wdir) is not a directory"
                    ))
                }
                Err(e) => {
                    return Err(format!(
                        "the working directory {w} (info wdir) is unusable: {e}"
                    ))
                }
            }
        }
    };
    let base = wdir.as_deref().unwrap_or(cwd);
    let path: Vec<PathBuf> = info("path")
        .map(|p| {
            p.split(':')
                .filter(|d| !d.is_empty())
                .map(|d| base.join(d))
                .collect()
        })
        .unwrap_or_default();
    let exe = resolve_exe(&cmd.exe, &path, base)?;
    let hosts = match info("host").or_else(|| info("hosts")) {
        None => None,
        Some(v) => Some(parse_hosts(v, hosts)?),
    };
    Ok(Prepared {
        exe,
        name: cmd.exe.clone(),
        args: cmd.args.clone(),
        count: cmd.maxprocs,
        wdir,
        hosts,
    })
}

/// Why `p` cannot be executed, if it cannot.
fn not_executable(p: &Path) -> Option<String> {
    match std::fs::metadata(p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some("it does not exist".into()),
        Err(e) => Some(e.to_string()),
        Ok(m) if !m.is_file() => Some("it is not a regular file".into()),
        Ok(_) => {
            let c = CString::new(p.as_os_str().as_bytes()).ok()?;
            // SAFETY: access(2) on a NUL-terminated path.
            if unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0 {
                None
            } else {
                Some("it is not executable (permission denied)".into())
            }
        }
    }
}

/// The program `exe`: a path (relative to `base`) when it contains `/`, else the first executable file of
/// that name in `path`, then in `PATH`.
pub(crate) fn resolve_exe(exe: &str, path: &[PathBuf], base: &Path) -> Result<PathBuf, String> {
    if exe.contains('/') {
        let p = base.join(exe);
        return match not_executable(&p) {
            None => Ok(p),
            Some(why) => Err(format!("cannot execute {exe} since {why}")),
        };
    }
    let env_path: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| {
                    if d.as_os_str().is_empty() {
                        base.to_path_buf()
                    } else {
                        base.join(d)
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    let mut unusable = None;
    for dir in path.iter().chain(&env_path) {
        let cand = dir.join(exe);
        match not_executable(&cand) {
            None => return Ok(cand),
            Some(why) if cand.exists() && unusable.is_none() => {
                unusable = Some(format!("cannot execute {} since {why}", cand.display()))
            }
            Some(_) => {}
        }
    }
    Err(unusable.unwrap_or_else(|| {
        let searched = if path.is_empty() {
            "PATH".to_string()
        } else {
            format!(
                "{} (info path) and PATH",
                path.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(":")
            )
        };
        format!("the executable {exe} was not found in {searched}")
    }))
}

/// The host(s) named by an info `host` value: a comma-separated list. With emulated hosts (`hosts`, their
/// names and addresses, not empty) a host is `hostK`, `K`, its name (what `MPI_Get_processor_name` says
/// there) or its address; without them only this machine (`localhost`, its host name, a loopback
/// address) is accepted, as host 0.
pub(crate) fn parse_hosts(v: &str, hosts: &[(String, String)]) -> Result<Vec<usize>, String> {
    let names: Vec<&str> = v
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .collect();
    if names.is_empty() {
        return Err(format!("the info host value {v:?} names no host"));
    }
    names.iter().map(|h| parse_host(h, hosts)).collect()
}

fn parse_host(h: &str, hosts: &[(String, String)]) -> Result<usize, String> {
    let n = hosts.len();
    if n > 0 {
        let idx = h
            .strip_prefix("host")
            .unwrap_or(h)
            .parse::<usize>()
            .ok()
            .or_else(|| hosts.iter().position(|(name, ip)| ip == h || name == h));
        return match idx {
            Some(i) if i < n => Ok(i),
            _ => Err(format!(
                "host {h} is not one of the job's {n} emulated hosts (host0..host{}, 0..{}, their names {}..{}, or their addresses)",
                n - 1,
                n - 1,
                hosts[0].0,
                hosts[n - 1].0
            )),
        };
    }
    let me = vmf_pal::hostid::hostname();
    let short = me.split('.').next().unwrap_or("");
    if ["localhost", "127.0.0.1", "::1"].contains(&h) || (!me.is_empty() && (h == me || h == short))
    {
        return Ok(0);
    }
    Err(format!(
        "host {h} is not this machine ({}); vmfabric run starts processes on this machine only \
         (emulated hosts with --hosts)",
        if me.is_empty() { "localhost" } else { &me }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn cmd(exe: &str, info: &[(&str, &str)]) -> SpawnCmd {
        SpawnCmd {
            exe: exe.into(),
            args: vec!["a".into()],
            maxprocs: 2,
            info: info
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn info_keys_are_honoured_works() {
        let d = std::env::temp_dir().join(format!("vmf-spawn-unit-{}", std::process::id()));
        let bin = d.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let prog = bin.join("prog");
        std::fs::write(&prog, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
        let plain = bin.join("plain");
        std::fs::write(&plain, "").unwrap();
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
        let cwd = Path::new("/");

        // path: searched before PATH; relative directories are relative to wdir.
        let p = prepare(
            &cmd(
                "prog",
                &[
                    ("wdir", d.to_str().unwrap()),
                    ("path", "nothing-here:bin"),
                    ("color", "x"),
                ],
            ),
            &[],
            cwd,
        )
        .unwrap();
        assert_eq!(p.exe, prog);
        assert_eq!(p.wdir.as_deref(), Some(d.as_path()));
        assert_eq!(
            (p.name.as_str(), p.count, p.hosts.clone()),
            ("prog", 2, None)
        );
        // A relative program path is relative to wdir.
        let p = prepare(
            &cmd("./bin/prog", &[("wdir", d.to_str().unwrap())]),
            &[],
            cwd,
        )
        .unwrap();
        assert_eq!(p.exe, d.join("./bin/prog"));
        // PATH is searched too.
        assert!(prepare(&cmd("sh", &[]), &[], cwd)
            .unwrap()
            .exe
            .ends_with("sh"));

        let err = |c: SpawnCmd| prepare(&c, &[], cwd).unwrap_err();
        let e = err(cmd("vmf-no-such-program-x", &[]));
        assert!(
            e.contains("vmf-no-such-program-x was not found in PATH"),
            "{e}"
        );
        let e = err(cmd(
            "vmf-no-such-program-x",
            &[("path", bin.to_str().unwrap())],
        ));
        assert!(e.contains("(info path) and PATH"), "{e}");
        let e = err(cmd(plain.to_str().unwrap(), &[]));
        assert!(e.contains("is not executable"), "{e}");
        let e = err(cmd("plain", &[("path", bin.to_str().unwrap())]));
        assert!(e.contains("plain since it is not executable"), "{e}");
        let e = err(cmd(bin.to_str().unwrap(), &[]));
        assert!(e.contains("not a regular file"), "{e}");
        let e = err(cmd("prog", &[("wdir", "/nonexistent/vmf-dir")]));
        assert!(
            e.contains("working directory /nonexistent/vmf-dir (info wdir)"),
            "{e}"
        );
        let e = err(cmd("prog", &[("wdir", prog.to_str().unwrap())]));
        assert!(e.contains("is not a directory"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn hosts_are_parsed_works() {
        let ips: Vec<(String, String)> =
            (1..=3).map(|i| (format!("vmf-j-h{}", i - 1), format!("198.18.0.{i}"))).collect();
        assert_eq!(parse_hosts("host2", &ips).unwrap(), vec![2]);
        assert_eq!(parse_hosts("vmf-j-h1,vmf-j-h0", &ips).unwrap(), vec![1, 0]);
        assert_eq!(
            parse_hosts("1, host0,198.18.0.3", &ips).unwrap(),
            vec![1, 0, 2]
        );
        for bad in ["host3", "7", "elsewhere", "", " , ", "vmf-j-h3", "vmf-k-h0"] {
            assert!(parse_hosts(bad, &ips).is_err(), "{bad}");
        }
        let e = parse_hosts("host9", &ips).unwrap_err();
        assert!(
            e.contains("host host9 is not one of the job's 3 emulated hosts"),
            "{e}"
        );
        // Without emulated hosts: this machine only.
        assert_eq!(parse_hosts("localhost", &[]).unwrap(), vec![0]);
        assert_eq!(parse_hosts(&vmf_pal::hostid::hostname(), &[]).unwrap(), vec![0]);
        let e = parse_hosts("far-away-node", &[]).unwrap_err();
        assert!(
            e.starts_with("host far-away-node is not this machine"),
            "{e}"
        );
        assert!(parse_hosts("host1", &[]).is_err());
    }
}
