//! Where mwmq's objects live in its database, and how a database gets
//! there: [`migrate`] creates or upgrades the schema.
//!
//! Since schema version 11 every table, sequence, function and type mwmq
//! creates is in the schema `mwmq`, which only mwmq's database user owns
//! and nobody else may create in (CREATE is revoked from PUBLIC). mwmq's own
//! connections run with `search_path = mwmq` (`db::session_settings`):
//! PostgreSQL then looks in `pg_catalog` first, then `mwmq`, and never in
//! `public` or in a temporary schema for a function or an operator, so an
//! object someone else planted (a `public.nextval(text)`, an operator `*`
//! on `interval` and `bigint` in `public`) is never what mwmq's statements
//! call. Before version 11 the objects were created in whatever
//! `current_schema()` the connection had (usually `public`, where before
//! PostgreSQL 15 anyone may create objects). A database created then has
//! its objects moved into `mwmq` first ([`MOVE`]), then the migrations it
//! lacks run, all in the migration's one transaction.

use postgres::Transaction;

use crate::config::Config;

/// The schema mwmq owns.
pub const SCHEMA: &str = "mwmq";

/// The advisory lock that serialises migrations of mwmq processes starting together.
const MIGRATION_LOCK: i64 = 0x6d77_6d71; // "mwmq"

/// The schemas holding a version table (`mwmq` first when it has one).
const VERSION_TABLES: &str = "SELECT n.nspname::text FROM pg_catalog.pg_class c
     JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE c.relname = 'mwmq_schema' AND c.relkind = 'r'
     ORDER BY n.nspname <> 'mwmq', n.nspname";

/// Moves mwmq's objects from the schema named by the setting
/// `mwmq.move_from` into `mwmq`: what is named `mwmq_...` there and owned
/// by the owner of its version table (an object someone else named so
/// stays where it is). A table takes its indexes, constraints, triggers,
/// row type and the sequences of its columns along; the other sequences,
/// the functions and the types are moved one by one. Anything of mwmq's
/// left behind stops the migration.
const MOVE: &str = r#"
DO $move$
DECLARE
    old name := current_setting('mwmq.move_from');
    ns oid := (SELECT n.oid FROM pg_namespace n WHERE n.nspname = old);
    owner oid := (SELECT c.relowner FROM pg_class c WHERE c.relnamespace = ns AND c.relname = 'mwmq_schema');
    r record;
    left_over text;
BEGIN
    FOR r IN SELECT c.relname, c.relkind FROM pg_class c
             WHERE c.relnamespace = ns AND c.relname LIKE 'mwmq\_%' AND c.relowner = owner
               AND c.relkind IN ('r', 'p', 'v', 'm', 'f') ORDER BY c.relname LOOP
        EXECUTE format('ALTER %s %I.%I SET SCHEMA mwmq',
                       CASE r.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
                                      WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END, old, r.relname);
    END LOOP;
    FOR r IN SELECT c.relname FROM pg_class c
             WHERE c.relnamespace = ns AND c.relname LIKE 'mwmq\_%' AND c.relowner = owner AND c.relkind = 'S'
               AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                               AND d.objid = c.oid AND d.deptype IN ('a', 'i')) LOOP
        EXECUTE format('ALTER SEQUENCE %I.%I SET SCHEMA mwmq', old, r.relname);
    END LOOP;
    FOR r IN SELECT t.typname, t.typtype FROM pg_type t
             WHERE t.typnamespace = ns AND t.typname LIKE 'mwmq\_%' AND t.typowner = owner
               AND (t.typrelid = 0 OR (SELECT c.relkind FROM pg_class c WHERE c.oid = t.typrelid) = 'c') LOOP
        EXECUTE format('ALTER %s %I.%I SET SCHEMA mwmq',
                       CASE r.typtype WHEN 'd' THEN 'DOMAIN' ELSE 'TYPE' END, old, r.typname);
    END LOOP;
    FOR r IN SELECT p.proname, pg_get_function_identity_arguments(p.oid) AS args FROM pg_proc p
             WHERE p.pronamespace = ns AND p.proname LIKE 'mwmq\_%' AND p.proowner = owner LOOP
        EXECUTE format('ALTER ROUTINE %I.%I(%s) SET SCHEMA mwmq', old, r.proname, r.args);
    END LOOP;
    SELECT string_agg(x, ', ') INTO left_over FROM (
        SELECT c.relname::text AS x FROM pg_class c
        WHERE c.relnamespace = ns AND c.relname LIKE 'mwmq\_%' AND c.relowner = owner
        UNION ALL
        SELECT p.proname::text FROM pg_proc p WHERE p.pronamespace = ns AND p.proname LIKE 'mwmq\_%' AND p.proowner = owner
        UNION ALL
        SELECT t.typname::text FROM pg_type t
        WHERE t.typnamespace = ns AND t.typname LIKE 'mwmq\_%' AND t.typowner = owner) l;
    IF left_over IS NOT NULL THEN
        RAISE EXCEPTION 'mwmq objects left in schema %: %', old, left_over;
    END IF;
END
$move$;
"#;

/// Creates or migrates the schema of the database `cfg` names: `migrations`
/// are the versions in order, each applied once; refuses a database whose
/// schema is newer than this program. Everything happens in one
/// transaction, under an advisory lock, so a second mwmq starting at the
/// same time waits and then finds the work done.
pub fn migrate_with(cfg: &Config, migrations: &[&str]) -> Result<u32, String> {
    let mut client = super::connect(cfg)?;
    let mut tx = client.transaction().map_err(|e| e.to_string())?;
    // The migrations' notices ("schema ... already exists, skipping") are
    // PostgreSQL talking to itself, not news for mwmq's log.
    tx.batch_execute("SET LOCAL client_min_messages = warning").map_err(sql_error)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).map_err(sql_error)?;
    own_schema(&mut tx)?;
    let found: Vec<String> = tx.query(VERSION_TABLES, &[]).map_err(sql_error)?.iter().map(|r| r.get(0)).collect();
    match found.first().map(String::as_str) {
        Some(SCHEMA) if found.len() > 1 => tracing::warn!(
            "mwmq's version table is in schema mwmq, and also in {:?}, which mwmq no longer uses",
            &found[1..]
        ),
        Some(SCHEMA) | None => {}
        Some(old) if found.len() == 1 => {
            tracing::info!(from = old, "moving mwmq's tables and functions into the schema mwmq");
            tx.execute("SELECT pg_catalog.set_config('mwmq.move_from', $1, true)", &[&old]).map_err(sql_error)?;
            tx.batch_execute(MOVE).map_err(|e| format!("moving mwmq's objects from schema {old}: {}", sql_error(e)))?;
        }
        Some(_) => {
            let all = found.join(", ");
            return Err(format!("mwmq's version table is in several schemas ({all}): keep the one mwmq uses"));
        }
    }
    if found.is_empty() {
        tx.batch_execute("CREATE TABLE mwmq.mwmq_schema (version integer NOT NULL)").map_err(sql_error)?;
    }
    let current: i32 =
        tx.query_one("SELECT coalesce(max(version), 0) FROM mwmq.mwmq_schema", &[]).map_err(sql_error)?.get(0);
    let known = migrations.len() as i32;
    if current > known {
        return Err(format!(
            "the database's mwmq schema is version {current}, newer than this mwmq ({known}): use a newer mwmq"
        ));
    }
    for (i, sql) in migrations.iter().enumerate().skip(current as usize) {
        tx.batch_execute(sql).map_err(|e| format!("schema version {}: {}", i + 1, sql_error(e)))?;
        tx.execute("INSERT INTO mwmq.mwmq_schema (version) VALUES ($1)", &[&(i as i32 + 1)]).map_err(sql_error)?;
    }
    if current < known {
        // PostgreSQL lets PUBLIC execute a new function: nobody but mwmq's
        // role and the roles granted mwmq.send/ack may run any of mwmq's
        // (those two were granted by name, which this does not take back).
        tx.batch_execute("REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA mwmq FROM PUBLIC").map_err(sql_error)?;
    }
    warn_of_creators(&mut tx)?;
    tx.commit().map_err(|e| e.to_string())?;
    if current < known {
        tracing::info!(from = current, to = known, "database schema migrated");
    }
    Ok(known as u32)
}

/// PostgreSQL's message and SQLSTATE.
fn sql_error(e: postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{} ({})", d.message(), d.code().code()),
        None => e.to_string(),
    }
}

/// Creates the schema `mwmq` if it is missing; refuses one that belongs to
/// a role mwmq's user cannot trust: its owner could replace mwmq's
/// functions. Trusted: mwmq's user itself, a superuser, or a role whose
/// member mwmq's user is (unless mwmq's user is a superuser, which counts
/// as a member of every role).
fn own_schema(tx: &mut Transaction<'_>) -> Result<(), String> {
    let exists =
        tx.query_opt("SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = 'mwmq'", &[]).map_err(sql_error)?;
    if exists.is_none() {
        tx.batch_execute("CREATE SCHEMA mwmq").map_err(|e| {
            format!("creating the schema mwmq (mwmq's database user needs CREATE on the database): {}", sql_error(e))
        })?;
    }
    let row = tx
        .query_one(
            "SELECT pg_catalog.pg_get_userbyid(n.nspowner)::text, current_user::text,
                    o.rolname = current_user OR o.rolsuper
                    OR (NOT (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user)
                        AND pg_catalog.pg_has_role(current_user, o.oid, 'MEMBER'))
             FROM pg_catalog.pg_namespace n JOIN pg_catalog.pg_roles o ON o.oid = n.nspowner
             WHERE n.nspname = 'mwmq'",
            &[],
        )
        .map_err(sql_error)?;
    let (owner, me, trusted): (String, String, bool) = (row.get(0), row.get(1), row.get(2));
    if !trusted {
        return Err(format!(
            "the schema mwmq belongs to the role {owner}, not to mwmq's database user {me}: its owner could replace \
             mwmq's functions. Drop it, or ALTER SCHEMA mwmq OWNER TO {me}"
        ));
    }
    Ok(())
}

/// Warns of the roles other than its owner that may create objects in
/// `mwmq` (granted by hand): each could plant what mwmq's statements call.
fn warn_of_creators(tx: &mut Transaction<'_>) -> Result<(), String> {
    let rows = tx
        .query(
            "SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.pg_get_userbyid(a.grantee)::text END
             FROM pg_catalog.pg_namespace n, pg_catalog.aclexplode(n.nspacl) a
             WHERE n.nspname = 'mwmq' AND a.privilege_type = 'CREATE' AND a.grantee <> n.nspowner",
            &[],
        )
        .map_err(sql_error)?;
    for r in rows {
        let role: String = r.get(0);
        tracing::warn!(
            role = %role,
            "may create objects in the schema mwmq, and so replace what mwmq's statements and functions call: \
             REVOKE CREATE ON SCHEMA mwmq FROM {role}"
        );
    }
    Ok(())
}

/// Schema versions, applied in order ([`migrate_with`]), in one transaction.
pub const MIGRATIONS: &[&str] = &[
    include_str!("../../sql/0001_queues.sql"),
    include_str!("../../sql/0002_dead_letters.sql"),
    include_str!("../../sql/0003_ready_index.sql"),
    include_str!("../../sql/0004_lease_tokens.sql"),
    include_str!("../../sql/0005_quotas.sql"),
    include_str!("../../sql/0006_streams.sql"),
    include_str!("../../sql/0007_sql_api.sql"),
    include_str!("../../sql/0008_limits.sql"),
    include_str!("../../sql/0009_retention.sql"),
    include_str!("../../sql/0010_rate_counts_pops.sql"),
    include_str!("../../sql/0011_schema_mwmq.sql"),
    include_str!("../../sql/0012_stream_rules.sql"),
    include_str!("../../sql/0013_stream_bounds.sql"),
    include_str!("../../sql/0014_sql_quota.sql"),
    include_str!("../../sql/0015_reply_bounds.sql"),
    include_str!("../../sql/0016_sql_bounds.sql"),
    include_str!("../../sql/0017_priorities_backoff.sql"),
    include_str!("../../sql/0018_schedules.sql"),
    include_str!("../../sql/0019_prioritize.sql"),
];

/// Creates or migrates the schema ([`migrate_with`]); refuses a database whose schema is newer than this program.
pub fn migrate(cfg: &Config) -> Result<u32, String> {
    migrate_with(cfg, MIGRATIONS)
}
