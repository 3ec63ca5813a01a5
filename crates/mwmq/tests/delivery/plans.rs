//! The plans PostgreSQL makes of the statements every mwmq connection
//! prepares: none may reach a message through the primary key by its queue
//! alone. Such a plan scans the whole queue for each message it leases or
//! removes, and PostgreSQL takes it when a queue's statistics are those of
//! a small table (as after a burst of SENDs, before autovacuum analyses):
//! a RECV of a queue with priorities once took 2.7 ms where 0.4 ms does.
//! Each statement is planned as mwmq's sessions plan it (their settings),
//! generic (the plan a prepared statement keeps) and custom, over a queue
//! of a few thousand messages of several priorities, half of them leased.

use crate::common::*;
use mctest::Postgres;
use mwmq::Service;
use serde_json::Value;

/// The index scans of the messages' primary key in `plan` whose condition
/// does not name the message's id, as "node: condition".
fn by_queue_alone(plan: &Value, out: &mut Vec<String>) {
    if plan.get("Index Name").and_then(Value::as_str) == Some("mwmq_messages_pkey") {
        let cond = plan.get("Index Cond").and_then(Value::as_str).unwrap_or("");
        if !cond.contains("(id = ") {
            out.push(format!("{}: {cond}", plan["Node Type"].as_str().unwrap_or("?")));
        }
    }
    if plan.get("Relation Name").and_then(Value::as_str) == Some("mwmq_messages")
        && plan.get("Node Type").and_then(Value::as_str) == Some("Seq Scan")
    {
        out.push("Seq Scan of mwmq_messages".into());
    }
    for child in plan.get("Plans").and_then(Value::as_array).into_iter().flatten() {
        by_queue_alone(child, out);
    }
}

#[test]
fn no_statement_reaches_a_message_by_its_queue_alone() {
    let pg = Postgres::start().unwrap();
    let cfg = config(&pg);
    let settings = mwmq::db::session_settings(&cfg);
    let mq = start(cfg);
    let mut c = connect(mq.local_addr());
    assert_eq!(q::<String>(&mut c, &["QCREATE", "jobs"]), "OK");
    let mut db = sql(&pg);
    db.batch_execute("SELECT mwmq.send('jobs', 'job ' || g, priority => g % 8) FROM generate_series(1, 4000) g")
        .unwrap();
    db.batch_execute("VACUUM mwmq.mwmq_messages").unwrap();
    let leased = recv(&mut c, "jobs", &["COUNT", "1000"]);
    assert_eq!(leased.len(), 1000);
    db.batch_execute(&settings).unwrap();
    let mut wrong = Vec::new();
    for mode in ["force_generic_plan", "force_custom_plan"] {
        db.batch_execute(&format!("SET plan_cache_mode = {mode}")).unwrap();
        for (name, text) in mwmq::db::statements::all() {
            db.batch_execute(&format!("DEALLOCATE ALL; PREPARE s AS {text}")).unwrap();
            let types: Vec<String> = db
                .query_one("SELECT parameter_types::text[] FROM pg_prepared_statements WHERE name = 's'", &[])
                .unwrap()
                .get(0);
            // Values as a request would give them: the queue's name first,
            // NULL for the rest (a custom plan folds them; a generic one
            // does not look).
            let args: Vec<String> = types
                .iter()
                .enumerate()
                .map(|(i, t)| if i == 0 && t == "text" { "'jobs'".to_string() } else { format!("NULL::{t}") })
                .collect();
            let explained = db.simple_query(&format!("EXPLAIN (FORMAT JSON) EXECUTE s({})", args.join(", "))).unwrap();
            let text = explained
                .iter()
                .find_map(|m| match m {
                    postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
                    _ => None,
                })
                .expect("EXPLAIN's row");
            let plan: Value = serde_json::from_str(&text).unwrap();
            let mut found = Vec::new();
            by_queue_alone(&plan[0]["Plan"], &mut found);
            wrong.extend(found.into_iter().map(|f| format!("{name} ({mode}): {f}")));
        }
    }
    assert!(wrong.is_empty(), "plans that scan a queue's messages for one:\n{}", wrong.join("\n"));
}
