//! The doctor's verdict, pure: each node against rank 0's (versions, driver, GPU count, the
//! shared file system, the clock) and the limits (paths, disk, memory, GPU health); each link
//! against the median of its kind; `doctor.json`'s summary, the console table and
//! `hostfile.healthy`.
use crate::hostfile::Host;
use tchrun::doctor::{
    gpu_problems, median, DoctorChecks, DoctorReport, FailedHost, LinkVerdict, Network, NodeReport,
    MAX_CLOCK_OFFSET_MS, SCHEMA,
};

const GIB: f64 = (1u64 << 30) as f64;

/// Fills each node's `problems` (rank 0's report is the reference; `nodes` in rank order).
pub fn judge_nodes(nodes: &mut [NodeReport], checks: &DoctorChecks) {
    let Some(reference) = nodes.first().cloned() else {
        return;
    };
    for n in nodes.iter_mut() {
        let mut p = Vec::new();
        if n.tchrun_version != reference.tchrun_version {
            p.push(format!(
                "tchrun {} here, {} on rank 0's host {}",
                n.tchrun_version, reference.tchrun_version, reference.host
            ));
        }
        if n.torch_version != reference.torch_version {
            p.push(format!(
                "torch {} here, {} on rank 0's host {}",
                n.torch_version, reference.torch_version, reference.host
            ));
        }
        if n.gpus.driver != reference.gpus.driver {
            p.push(format!(
                "GPU driver {} here, {} on rank 0's host {}",
                n.gpus.driver.as_deref().unwrap_or("none"),
                reference.gpus.driver.as_deref().unwrap_or("none"),
                reference.host
            ));
        }
        if n.gpus.count != reference.gpus.count {
            p.push(format!(
                "{} GPU(s) here, {} on rank 0's host {}",
                n.gpus.count, reference.gpus.count, reference.host
            ));
        }
        for g in &n.gpus.health {
            p.extend(gpu_problems(g));
        }
        for c in &n.paths {
            if let Some(e) = &c.error {
                p.push(format!("{} {}: {e}", c.flag, c.path.display()));
            }
        }
        if n.host != reference.host {
            let here = n.unread_from.contains(&reference.host);
            let there = reference.unread_from.contains(&n.host);
            let how = match (here, there) {
                (true, true) => Some("neither node sees the other's file"),
                (true, false) => Some("rank 0's file is not seen here"),
                (false, true) => Some("this node's file is not seen there"),
                (false, false) => None,
            };
            if let Some(how) = how {
                p.push(format!(
                    "{} is not shared with rank 0's host {}: {how}",
                    n.shared_dir.display(),
                    reference.host
                ));
            }
        }
        if n.clock_offset_ms.abs() > MAX_CLOCK_OFFSET_MS {
            p.push(format!(
                "clock {:+.0} ms off rank 0's (at most {MAX_CLOCK_OFFSET_MS:.0} ms)",
                n.clock_offset_ms
            ));
        }
        if let Some(b) = n.disk_free_bytes {
            if (b as f64) < checks.min_free_disk_gib * GIB {
                p.push(format!(
                    "{:.2} GiB free in {} (at least {} GiB: --min-free-disk-gib)",
                    b as f64 / GIB,
                    n.shared_dir.display(),
                    checks.min_free_disk_gib
                ));
            }
        }
        if let Some(b) = n.memory_available_bytes {
            if (b as f64) < checks.min_free_memory_gib * GIB {
                p.push(format!(
                    "{:.2} GiB memory available (at least {} GiB: --min-free-memory-gib)",
                    b as f64 / GIB,
                    checks.min_free_memory_gib
                ));
            }
        }
        n.problems = p;
    }
}

/// Sets each link's ratio to the median of its kind and its verdict.
pub fn judge_links(net: &mut Network, slow_ratio: f64) {
    let of_kind = |intra: bool| -> Vec<f64> {
        net.links
            .iter()
            .filter(|l| l.intra_node == intra)
            .filter_map(|l| l.busbw_gbs)
            .collect()
    };
    net.median_intra_gbs = median(&of_kind(true));
    net.median_inter_gbs = median(&of_kind(false));
    for l in &mut net.links {
        let m = if l.intra_node {
            net.median_intra_gbs
        } else {
            net.median_inter_gbs
        };
        match (l.busbw_gbs, m) {
            (None, _) => {
                l.vs_median = None;
                l.verdict = LinkVerdict::Broken;
            }
            (Some(bw), Some(m)) if m > 0.0 => {
                let r = bw / m;
                l.vs_median = Some(r);
                l.verdict = if r < slow_ratio {
                    LinkVerdict::Slow
                } else {
                    LinkVerdict::Ok
                };
            }
            (Some(_), _) => {
                l.vs_median = None;
                l.verdict = LinkVerdict::Ok;
            }
        }
    }
}

/// The report: nodes judged, links judged, the failed hosts and the healthy ones in `hosts`'
/// order (the launch's hosts; the nodes' own names when the launch named none).
pub fn report(
    mut nodes: Vec<NodeReport>,
    mut network: Option<Network>,
    network_note: Option<String>,
    checks: &DoctorChecks,
) -> DoctorReport {
    judge_nodes(&mut nodes, checks);
    let mut bad_links = Vec::new();
    if let Some(net) = network.as_mut() {
        judge_links(net, checks.slow_link_ratio);
        for l in &net.links {
            let what = match l.verdict {
                LinkVerdict::Ok => continue,
                LinkVerdict::Slow => format!(
                    "slow: {:.3} GB/s, {:.2}x the {} median",
                    l.busbw_gbs.unwrap_or(0.0),
                    l.vs_median.unwrap_or(0.0),
                    if l.intra_node {
                        "intra-node"
                    } else {
                        "inter-node"
                    }
                ),
                LinkVerdict::Broken => {
                    format!("broken: {}", l.error.as_deref().unwrap_or("no measurement"))
                }
            };
            bad_links.push(format!(
                "link rank {} ({}) <-> rank {} ({}) {what}",
                l.ranks[0], l.hosts[0], l.ranks[1], l.hosts[1]
            ));
        }
    }
    let failed_hosts: Vec<FailedHost> = nodes
        .iter()
        .filter(|n| !n.problems.is_empty())
        .map(|n| FailedHost {
            host: n.host.clone(),
            reasons: n.problems.clone(),
        })
        .collect();
    let healthy_hosts = nodes
        .iter()
        .filter(|n| n.problems.is_empty())
        .map(|n| n.host.clone())
        .collect();
    DoctorReport {
        schema: SCHEMA,
        healthy: failed_hosts.is_empty() && bad_links.is_empty(),
        nodes,
        network,
        network_note,
        failed_hosts,
        bad_links,
        healthy_hosts,
    }
}

/// `hostfile.healthy`: the launch's hosts (or the nodes' names with `slots` each) that passed,
/// each failed one commented out with its reasons beside it, and a comment per bad link.
pub fn healthy_hostfile(r: &DoctorReport, hosts: &[Host], slots: u32) -> String {
    let named: Vec<Host> = if hosts.is_empty() {
        r.nodes
            .iter()
            .map(|n| Host {
                name: n.host.clone(),
                slots: Some(slots),
            })
            .collect()
    } else {
        hosts.to_vec()
    };
    // Hosts where no rank started are failed hosts without a node report: counted too.
    let mut lines = vec![format!(
        "# tchrun doctor: {} of {} host(s) healthy",
        r.healthy_hosts.len(),
        named.len().max(r.nodes.len())
    )];
    for h in &named {
        let entry = h.line();
        let failed = r.failed_hosts.iter().find(|f| same_host(&f.host, &h.name));
        let seen = r.nodes.iter().any(|n| same_host(&n.host, &h.name));
        match failed {
            Some(f) => lines.push(format!("# {entry}  # left out: {}", f.reasons.join("; "))),
            None if !seen && !hosts.is_empty() => {
                lines.push(format!("# {entry}  # left out: no rank reported from it"))
            }
            None => lines.push(entry),
        }
    }
    for l in &r.bad_links {
        lines.push(format!("# {l}"));
    }
    lines.join("\n") + "\n"
}

/// A node's own hostname against a hostfile's name (`node1` and `node1.cluster` are one).
pub fn same_host(node: &str, listed: &str) -> bool {
    let short = |s: &str| s.split('.').next().unwrap_or(s).to_string();
    node == listed || short(node) == short(listed)
}

/// The console table.
pub fn table(r: &DoctorReport) -> String {
    let mut s = format!(
        "tchrun doctor: {} node(s), {}\n",
        r.nodes.len(),
        if r.healthy {
            "healthy".to_string()
        } else {
            format!(
                "{} host(s) failed, {} bad link(s)",
                r.failed_hosts.len(),
                r.bad_links.len()
            )
        }
    );
    s.push_str(&format!(
        "{:<16} {:<8} {:<14} {:<10} {:>4} {:>10} {:>10} {:>9}  {}\n",
        "host", "tchrun", "torch", "driver", "gpus", "disk GiB", "mem GiB", "clock ms", "verdict"
    ));
    let gib = |b: Option<u64>| b.map_or("-".to_string(), |b| format!("{:.1}", b as f64 / GIB));
    for n in &r.nodes {
        s.push_str(&format!(
            "{:<16} {:<8} {:<14} {:<10} {:>4} {:>10} {:>10} {:>+9.1}  {}\n",
            n.host,
            n.tchrun_version,
            n.torch_version,
            n.gpus.driver.as_deref().unwrap_or("-"),
            n.gpus.count,
            gib(n.disk_free_bytes),
            gib(n.memory_available_bytes),
            n.clock_offset_ms,
            if n.problems.is_empty() {
                "ok".to_string()
            } else {
                format!("FAILED: {}", n.problems.join("; "))
            }
        ));
    }
    if let Some(note) = r.nodes.iter().find_map(|n| n.gpus.note.as_deref()) {
        s.push_str(&format!("GPUs: {note}\n"));
    }
    match &r.network {
        Some(net) => s.push_str(&links_table(net)),
        None => s.push_str(&format!(
            "network: not measured ({})\n",
            r.network_note.as_deref().unwrap_or("no network phase")
        )),
    }
    s
}

fn links_table(net: &Network) -> String {
    let mut s = format!(
        "links: {} rank(s), {} round(s) of pairs, {} all-reduce (bus bandwidth)\n",
        net.world_size, net.rounds, net.backend
    );
    s.push_str(&format!(
        "{:>5} {:>9} {:<34} {:<6} {:>10} {:>9}  {}\n",
        "round", "ranks", "hosts", "kind", "GB/s", "x median", "verdict"
    ));
    for l in &net.links {
        s.push_str(&format!(
            "{:>5} {:>9} {:<34} {:<6} {:>10} {:>9}  {}\n",
            l.round,
            format!("{}-{}", l.ranks[0], l.ranks[1]),
            format!("{} <-> {}", l.hosts[0], l.hosts[1]),
            if l.intra_node { "intra" } else { "inter" },
            l.busbw_gbs.map_or("-".into(), |b| format!("{b:.3}")),
            l.vs_median.map_or("-".into(), |r| format!("{r:.2}")),
            match l.verdict {
                LinkVerdict::Ok => "ok".to_string(),
                LinkVerdict::Slow => "SLOW".to_string(),
                LinkVerdict::Broken =>
                    format!("BROKEN: {}", l.error.as_deref().unwrap_or("no measurement")),
            }
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::path::PathBuf;
    use tchrun::doctor::{Gpus, LinkReport};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        c: DoctorChecks,
    }

    fn checks() -> DoctorChecks {
        Cli::parse_from(["x"]).c
    }

    fn node(rank: usize, host: &str) -> NodeReport {
        NodeReport {
            rank,
            host: host.into(),
            tchrun_version: "1.0".into(),
            torch_version: "2.5".into(),
            gpus: Gpus::default(),
            paths: vec![],
            shared_dir: PathBuf::from("/out"),
            unread_from: vec![],
            disk_free_bytes: Some(100 << 30),
            memory_available_bytes: Some(100 << 30),
            clock_offset_ms: 0.0,
            problems: vec![],
        }
    }

    fn link(ranks: [usize; 2], intra: bool, bw: Option<f64>) -> LinkReport {
        LinkReport {
            round: 0,
            ranks,
            hosts: [format!("h{}", ranks[0]), format!("h{}", ranks[1])],
            intra_node: intra,
            bytes: 1 << 20,
            busbw_gbs: bw,
            error: bw.is_none().then(|| "timed out".into()),
            vs_median: None,
            verdict: LinkVerdict::Ok,
        }
    }

    #[test]
    fn a_node_unlike_rank_0_fails_with_each_reason() {
        let mut b = node(1, "b");
        b.torch_version = "2.4".into();
        b.unread_from = vec!["a".into()];
        b.clock_offset_ms = 2500.0;
        b.disk_free_bytes = Some(1 << 20);
        let r = report(vec![node(0, "a"), b, node(2, "c")], None, None, &checks());
        assert!(!r.healthy);
        assert_eq!(r.healthy_hosts, ["a", "c"]);
        let why = r.failed_hosts[0].reasons.join("\n");
        assert_eq!(r.failed_hosts[0].host, "b");
        for want in [
            "torch 2.4 here, 2.5 on rank 0's host a",
            "/out is not shared with rank 0's host a: rank 0's file is not seen here",
            "clock +2500 ms",
            "GiB free in /out",
        ] {
            assert!(why.contains(want), "{want}: {why}");
        }
        let hf = healthy_hostfile(&r, &[], 2);
        assert_eq!(
            hf.lines()
                .filter(|l| !l.starts_with('#'))
                .collect::<Vec<_>>(),
            ["a slots=2", "c slots=2"],
            "{hf}"
        );
        assert!(hf.contains("# b slots=2  # left out: torch 2.4"), "{hf}");
        let parsed = crate::hostfile::parse_hostfile(&PathBuf::from("h"), &hf).expect("parses");
        assert_eq!(parsed.len(), 2);
    }

    #[test]
    fn slow_and_broken_links_are_named_with_their_hosts() {
        let mut net = Network {
            world_size: 8,
            backend: "gloo".into(),
            rounds: 3,
            links: vec![
                link([0, 1], true, Some(10.0)),
                link([2, 3], true, Some(11.0)),
                link([0, 2], false, Some(1.0)),
                link([1, 3], false, Some(1.1)),
                link([4, 6], false, Some(0.2)),
                link([5, 7], false, None),
            ],
            median_intra_gbs: None,
            median_inter_gbs: None,
        };
        judge_links(&mut net, 0.5);
        assert_eq!(net.median_intra_gbs, Some(10.5));
        assert_eq!(net.median_inter_gbs, Some(1.0));
        let v: Vec<LinkVerdict> = net.links.iter().map(|l| l.verdict).collect();
        use LinkVerdict::*;
        assert_eq!(v, [Ok, Ok, Ok, Ok, Slow, Broken]);
        let r = report(vec![node(0, "a")], Some(net), None, &checks());
        assert!(!r.healthy);
        assert_eq!(r.bad_links.len(), 2);
        assert!(
            r.bad_links[0].starts_with("link rank 4 (h4) <-> rank 6 (h6) slow: 0.200 GB/s, 0.20x"),
            "{:?}",
            r.bad_links
        );
        assert!(r.bad_links[1].contains("broken: timed out"));
        let t = table(&r);
        assert!(t.contains("SLOW") && t.contains("BROKEN: timed out"), "{t}");
    }

    #[test]
    fn listed_hosts_keep_their_slots_and_a_silent_host_is_left_out() {
        let r = report(vec![node(0, "a.cluster")], None, None, &checks());
        let hosts = [
            Host {
                name: "a".into(),
                slots: Some(4),
            },
            Host {
                name: "b".into(),
                slots: None,
            },
        ];
        let hf = healthy_hostfile(&r, &hosts, 1);
        assert!(hf.contains("\na slots=4\n"), "{hf}");
        assert!(hf.contains("# b  # left out: no rank reported"), "{hf}");
    }
}
