//! Scenario 4, footprint: the operator process's resident memory and CPU at idle, first with
//! only the cluster (the baseline, same process, same run), then with N queues and S capture
//! subscriptions (each over one of the queues, so each installs a tap on every node).

use std::time::Duration;

use anyhow::Result;
use serde_json::json;

use crate::install::{Ctx, Install, settle};
use crate::objects::QueueWatch;
use crate::report::{Headline, Section, Table};

struct Idle {
    rss_mib: f64,
    /// CPU seconds per second (1.0 = one core busy).
    cpu_cores: f64,
    jolokia_per_poll: f64,
    /// Jolokia operations in the window by kind (read, search, or the operation).
    jolokia_by_kind: std::collections::BTreeMap<String, f64>,
}

async fn idle(ctx: &Ctx, install: &Install) -> Result<Idle> {
    let op = &install.operator;
    let (cpu0, c0) = (op.cpu_seconds()?, op.counts().await?);
    let start = std::time::Instant::now();
    settle(Duration::from_secs(ctx.cfg.idle_seconds)).await;
    let (cpu1, c1) = (op.cpu_seconds()?, op.counts().await?);
    let d = c1.since(&c0);
    Ok(Idle {
        rss_mib: op.rss_bytes()? as f64 / 1024.0 / 1024.0,
        cpu_cores: (cpu1 - cpu0) / start.elapsed().as_secs_f64(),
        jolokia_per_poll: if d.polls > 0.0 {
            d.jolokia() / d.polls
        } else {
            f64::NAN
        },
        jolokia_by_kind: d.jolokia_by_kind,
    })
}

pub async fn run(ctx: &Ctx) -> Result<Section> {
    let install = Install::up(ctx, "footprint", &[]).await?;
    let result = measure(ctx, &install).await;
    install.down(ctx).await;
    let (empty, loaded) = result?;
    Ok(section(ctx, &empty, &loaded))
}

async fn measure(ctx: &Ctx, install: &Install) -> Result<(Idle, Idle)> {
    settle(Duration::from_secs(3)).await;
    let empty = idle(ctx, install).await?;
    let n = ctx.cfg.footprint_queues;
    let names = ctx.queue_names("fp", n);
    let watch = QueueWatch::start(&install.objects);
    let o = &install.objects;
    o.create_queues(&names).await?;
    watch
        .wait_all(&names, ctx.cfg.wait_for(n), "Ready", |s| s.ready)
        .await?;
    for (k, q) in names.iter().take(ctx.cfg.footprint_subscriptions).enumerate() {
        o.create_subscription(&format!("bench-sub-{k}"), q).await?;
    }
    // A subscription change triggers a capture pass; wait until every tap is in place.
    o.wait_taps(ctx.jolokia.nodes.len(), Duration::from_secs(180))
        .await?;
    let loaded = idle(ctx, install).await;
    // Taps go first (their sweep needs the operator), then the queues.
    let subs = o.delete_subscriptions(Duration::from_secs(120)).await;
    o.delete_queues(&names).await?;
    let gone = watch
        .wait_all(&names, ctx.cfg.wait_for(n), "deleted", |s| s.deleted)
        .await;
    subs?;
    gone?;
    Ok((empty, loaded?))
}

fn section(ctx: &Ctx, empty: &Idle, loaded: &Idle) -> Section {
    let n = ctx.cfg.footprint_queues;
    let subs = ctx.cfg.footprint_subscriptions;
    let mut s = Section::new(
        "footprint",
        "4. Footprint",
        "The operator process at idle (no change to make) for the idle window: resident memory (VmRSS) at its end and CPU (user + system) over it, first with only the ArtemisCluster (baseline), then with N ArtemisQueues and S ArtemisCaptureSubscriptions (each over one of the queues: one tap per subscription on every node, installed before the window), capture passes at their default interval (30 s). One run each: no spread.",
    );
    let mut t = Table::new(&[
        "state",
        "RSS MiB",
        "CPU, % of one core",
        "Jolokia ops ÷ cluster polls (capture passes included)",
    ]);
    t.row(vec![
        "cluster only".into(),
        format!("{:.1}", empty.rss_mib),
        format!("{:.2}", empty.cpu_cores * 100.0),
        format!("{:.1}", empty.jolokia_per_poll),
    ]);
    t.row(vec![
        format!("{n} queues, {subs} subscriptions"),
        format!("{:.1}", loaded.rss_mib),
        format!("{:.2}", loaded.cpu_cores * 100.0),
        format!("{:.1}", loaded.jolokia_per_poll),
    ]);
    t.row(vec![
        "ratio".into(),
        format!("{:.2}", loaded.rss_mib / empty.rss_mib),
        format!("{:.2}", loaded.cpu_cores / empty.cpu_cores.max(1e-9)),
        format!("{:.2}", loaded.jolokia_per_poll / empty.jolokia_per_poll),
    ]);
    s.tables.push(t);
    s.headlines.push(Headline {
        what: format!("idle with {n} queues and {subs} subscriptions: RSS, CPU"),
        measured: format!(
            "{:.1} MiB ({:.2}× cluster only), {:.2}% of a core",
            loaded.rss_mib,
            loaded.rss_mib / empty.rss_mib,
            loaded.cpu_cores * 100.0
        ),
        target: "reported".into(),
        met: None,
    });
    s.notes
        .push(format!("Idle windows of {} s.", ctx.cfg.idle_seconds));
    let kinds = |i: &Idle| {
        i.jolokia_by_kind
            .iter()
            .map(|(k, v)| format!("{k} {v:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    s.notes.push(format!(
        "Jolokia operations in the idle window by kind — cluster only: {}; loaded: {}.",
        kinds(empty),
        kinds(loaded)
    ));
    s.json = json!({
        "queues": n, "subscriptions": subs, "idleSeconds": ctx.cfg.idle_seconds,
        "clusterOnly": {"rssMiB": empty.rss_mib, "cpuCores": empty.cpu_cores, "jolokiaOpsPerPoll": empty.jolokia_per_poll, "jolokiaOpsByKind": empty.jolokia_by_kind},
        "loaded": {"rssMiB": loaded.rss_mib, "cpuCores": loaded.cpu_cores, "jolokiaOpsPerPoll": loaded.jolokia_per_poll, "jolokiaOpsByKind": loaded.jolokia_by_kind},
    });
    s
}
