//! PMI smoke test: every rank puts a key, fences, reads every rank's key and checks it.
//! Run with `vmfabric run -n 4 target/debug/examples/pmi_ring`; exits 1 on any mismatch or error.
use vmf_pmi::PmiClient;

fn main() {
    if let Err(e) = ring() {
        eprintln!("pmi_ring: {e}");
        std::process::exit(1);
    }
}

fn ring() -> Result<(), Box<dyn std::error::Error>> {
    let mut pmi = PmiClient::from_env()?
        .ok_or("Unable to run since no PMI server is set (PMI_FD/PMI_PORT)")?;
    let (me, n) = (pmi.rank(), pmi.size());
    pmi.put(&format!("ring-{me}"), &format!("hello-from-{me}"))?;
    pmi.fence()?;
    for r in 0..n {
        let v = pmi.get(&format!("ring-{r}"))?;
        if v != format!("hello-from-{r}") {
            return Err(format!("Unable to verify rank {r}'s key since its value is {v:?}").into());
        }
    }
    pmi.fence()?;
    pmi.finalize()?;
    println!("pmi_ring: rank {me} of {n} ok");
    Ok(())
}
