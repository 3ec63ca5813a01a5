//! Periodic jobs (`QSCHEDULE`): the command's arguments ([`Schedule`]), a
//! cron expression read in a time zone ([`Timetable`]), and which of a
//! schedule's ticks a pass of the ticker sends ([`plan`]). Pure: words and
//! times in, refusals and times out; the clock is the
//! database's (`now()`, the same for every mwmq process sharing it), read
//! by the caller.
//!
//! Expressions are parsed by `croner` (five fields, `minute hour
//! day-of-month month day-of-week`, as Vixie cron; a sixth in front for
//! seconds; `@hourly`, `@daily`, `@weekly`, `@monthly`, `@yearly`), time
//! zones are IANA names read by `chrono-tz` (its own copy of the tz
//! database, so the host's does not matter): docs/mwmq.md says why these.
//!
//! A tick is **on time** while it is at most the grace (`[queues]
//! schedule_grace_ms`, 60 s) old: it is sent, whatever the schedule's
//! CATCHUP, so a ticker that was late by a poll, a database restart or a
//! failover loses nothing. An older tick is **missed** (no mwmq sent it in
//! time: every process was down, or the database was, for longer than the
//! grace): CATCHUP `none` sends none of them, `one` sends the latest, `all`
//! the latest [`MAX_CATCHUP`].

use std::str::FromStr;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;

use crate::words::{MAX_DELAY_MS, MAX_NAME};

/// The most missed ticks CATCHUP `all` sends (the latest ones; older ones
/// are skipped and counted as missed), as Kubernetes' CronJob stops at 100
/// missed schedules.
pub const MAX_CATCHUP: usize = 100;

/// The most ticks of one schedule one pass sends (on time and caught up):
/// the rest waits for the next pass, which follows at once.
pub const MAX_PER_PASS: usize = 1000;

/// Missed ticks counted per pass, at most (the count of a long outage of
/// a schedule firing every second stops there).
pub const MAX_COUNTED: usize = 10_000;

/// The `@` names croner reads (every other `@` is refused with what to write).
const AT_NAMES: [&str; 6] = ["@yearly", "@annually", "@monthly", "@weekly", "@daily", "@hourly"];

/// Longest cron expression, in bytes.
pub const MAX_EXPRESSION: usize = 200;

/// Longest schedule name, in bytes (its messages' default KEY is the name,
/// `@` and a tick of 20 bytes, within a KEY's 200).
pub const MAX_SCHEDULE_NAME: usize = 150;

/// A KEY prefix leaves room for the tick (20 bytes) in a KEY's [`MAX_NAME`].
pub const MAX_KEY_PREFIX: usize = MAX_NAME - 20;

/// `QSCHEDULE`'s arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// Its name (unique on its database).
    pub name: String,
    /// The queue its messages go to.
    pub queue: String,
    /// The cron expression (checked).
    pub cron: String,
    /// The IANA time zone it is read in (checked; default UTC).
    pub tz: String,
    /// Each message's body; `{tick}` in it is replaced by the tick.
    pub body: Vec<u8>,
    /// Each message's KEY is this and the tick (default: the name and `@`).
    pub key_prefix: String,
    /// What happens to missed ticks.
    pub catchup: Catchup,
    /// Each message's PRIORITY (0 to 9, as SEND's; default 0).
    pub priority: u8,
    /// Each message's GROUP (as SEND's; default none).
    pub group: Option<String>,
    /// Each message's DELAY, ms: it becomes visible this long after its
    /// tick's pass sent it (as SEND's; default 0).
    pub delay_ms: u64,
}

/// `what` as a name: 1 to `most` bytes of UTF-8 without spaces or control characters.
fn word(b: &[u8], what: &str, most: usize) -> Result<String, String> {
    let s = std::str::from_utf8(b).map_err(|_| format!("{what} must be UTF-8"))?;
    if s.is_empty() || s.len() > most || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{what} must be 1 to {most} bytes without spaces or control characters"));
    }
    Ok(s.to_string())
}

/// An integer argument, refused as Redis refuses one.
fn integer(b: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| "value is not an integer or out of range".to_string())
}

/// A schedule's name (QSCHEDULE, QUNSCHEDULE).
pub fn schedule_name(b: &[u8]) -> Result<String, String> {
    word(b, "a schedule name", MAX_SCHEDULE_NAME)
}

/// The refusal of an option given twice (Redis answers `SET k v EX 1 EX 2`
/// with a bare `syntax error`; this one says which).
pub fn given_twice(option: &str) -> String {
    format!("syntax error: {option} is given more than once")
}

/// QSCHEDULE's options, each at most once.
const OPTIONS: [&str; 6] = ["TZ", "KEY", "CATCHUP", "PRIORITY", "GROUP", "DELAY"];

impl Schedule {
    /// `name q "cron" body [TZ zone] [KEY prefix] [CATCHUP none|one|all]
    /// [PRIORITY n] [GROUP g] [DELAY ms]` (the words after QSCHEDULE), each
    /// option at most once; `Err(None)`: the wrong number of them.
    pub fn parse(rest: &[Vec<u8>]) -> Result<Schedule, Option<String>> {
        if rest.len() < 4 || !rest.len().is_multiple_of(2) {
            return Err(None);
        }
        let name = schedule_name(&rest[0])?;
        let queue = word(&rest[1], "a queue name", MAX_NAME)?;
        let cron = std::str::from_utf8(&rest[2])
            .map_err(|_| "a cron expression must be UTF-8".to_string())?
            .trim()
            .to_string();
        let mut s = Schedule {
            key_prefix: format!("{name}@"),
            name,
            queue,
            cron,
            tz: "UTC".into(),
            body: rest[3].clone(),
            catchup: Catchup::None,
            priority: 0,
            group: None,
            delay_ms: 0,
        };
        let mut seen = [false; OPTIONS.len()];
        for pair in rest[4..].chunks(2) {
            let option = String::from_utf8_lossy(&pair[0]).to_ascii_uppercase();
            let Some(i) = OPTIONS.iter().position(|o| *o == option) else {
                return Err(Some("syntax error".into()));
            };
            if std::mem::replace(&mut seen[i], true) {
                return Err(Some(given_twice(OPTIONS[i])));
            }
            match OPTIONS[i] {
                "TZ" => s.tz = word(&pair[1], "a time zone", 64)?,
                "KEY" => s.key_prefix = word(&pair[1], "a KEY prefix", MAX_KEY_PREFIX)?,
                "CATCHUP" => {
                    s.catchup = Catchup::parse(&String::from_utf8_lossy(&pair[1]))
                        .ok_or_else(|| "CATCHUP must be none, one or all".to_string())?
                }
                "PRIORITY" => s.priority = crate::policies::priority(integer(&pair[1])?)?,
                "GROUP" => s.group = Some(word(&pair[1], "a GROUP", MAX_NAME)?),
                _ => {
                    let ms = integer(&pair[1])?;
                    s.delay_ms = u64::try_from(ms)
                        .ok()
                        .filter(|ms| *ms <= MAX_DELAY_MS)
                        .ok_or_else(|| format!("DELAY must be between 0 and {MAX_DELAY_MS} ms"))?;
                }
            }
        }
        Timetable::new(&s.cron, &s.tz)?;
        Ok(s)
    }

    /// The length of each of its messages' bodies: the body with every
    /// `{tick}` (6 bytes) replaced by a tick's 20, which is what a SEND of
    /// its creator would carry, so what `max_body` limits.
    pub fn sent_len(&self) -> usize {
        body_for(&self.body, &tick_text(DateTime::<Utc>::UNIX_EPOCH)).len()
    }

    /// Its timetable (checked by [`Schedule::parse`]).
    pub fn timetable(&self) -> Result<Timetable, String> {
        Timetable::new(&self.cron, &self.tz)
    }
}

/// What happens to the ticks missed while no mwmq could send them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Catchup {
    /// Skipped: the schedule goes on with the next tick.
    #[default]
    None,
    /// One message, for the latest missed tick.
    One,
    /// One message for each, the latest [`MAX_CATCHUP`] at most.
    All,
}

impl Catchup {
    /// `none`, `one` or `all` (any case).
    pub fn parse(s: &str) -> Option<Catchup> {
        match s.to_ascii_lowercase().as_str() {
            "none" => Some(Catchup::None),
            "one" => Some(Catchup::One),
            "all" => Some(Catchup::All),
            _ => None,
        }
    }

    /// Its name, as stored and shown.
    pub fn name(self) -> &'static str {
        match self {
            Catchup::None => "none",
            Catchup::One => "one",
            Catchup::All => "all",
        }
    }
}

/// A cron expression in a time zone.
#[derive(Clone, Debug)]
pub struct Timetable {
    cron: Cron,
    tz: Tz,
}

impl Timetable {
    /// `expression` (five fields, or six with seconds first, or an `@`
    /// name) read in the IANA zone `tz`; the refusal says what is wrong.
    pub fn new(expression: &str, tz: &str) -> Result<Timetable, String> {
        if expression.len() > MAX_EXPRESSION {
            return Err(format!("a cron expression is at most {MAX_EXPRESSION} bytes"));
        }
        let fields = expression.split_whitespace().count();
        if !expression.trim_start().starts_with('@') && !(5..=6).contains(&fields) {
            return Err(format!(
                "cron expression '{expression}' has {fields} fields: five (minute hour day-of-month month \
                 day-of-week), six with seconds first, or @hourly, @daily, @weekly, @monthly, @yearly"
            ));
        }
        let at = expression.trim_start();
        if at.starts_with('@') && !AT_NAMES.iter().any(|n| at.eq_ignore_ascii_case(n)) {
            return Err(format!(
                "cron expression '{expression}': of the @ names only {} are read (no @every or @reboot: \
                 for every 10 seconds write \"*/10 * * * * *\")",
                AT_NAMES.join(", ")
            ));
        }
        let parser = CronParser::builder().seconds(Seconds::Optional).year(Year::Disallowed).build();
        let cron = parser.parse(expression).map_err(|e| match wrong_field(&parser, expression) {
            Some(field) => format!("cron expression '{expression}': {field}: {e}"),
            None => format!("cron expression '{expression}': {e}"),
        })?;
        let tz = Tz::from_str(tz).map_err(|_| {
            // The names are case-sensitive: say so when another case would be one.
            let hint = chrono_tz::TZ_VARIANTS
                .iter()
                .find(|z| z.name().eq_ignore_ascii_case(tz))
                .map(|z| format!(": did you mean {}? (the names are case-sensitive)", z.name()))
                .unwrap_or_else(|| " (an IANA name such as Europe/Berlin or UTC)".into());
            format!("unknown time zone '{tz}'{hint}")
        })?;
        Ok(Timetable { cron, tz })
    }

    /// The first tick after `now`, or the refusal of an expression that
    /// never fires (`0 0 30 2 *`: February has no 30th).
    pub fn first_after(&self, now: DateTime<Utc>) -> Result<DateTime<Utc>, String> {
        self.next_after(now).ok_or_else(|| {
            format!("cron expression '{}' never fires (no such date before the year 5000)", self.cron.pattern)
        })
    }

    /// The first tick after `t` (strictly).
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // (croner matches whole seconds: from a time within a second, the
        // search starts at that second's start, so `t` is rounded down first.)
        let t = floor_second(t);
        self.cron
            .find_next_occurrence(&t.with_timezone(&self.tz), false)
            .ok()
            .map(|d| floor_second(d.with_timezone(&Utc)))
    }

    /// The first tick at `t` or after.
    fn at_or_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let t = ceil_second(t);
        self.cron
            .find_next_occurrence(&t.with_timezone(&self.tz), true)
            .ok()
            .map(|d| floor_second(d.with_timezone(&Utc)))
    }

    /// The last tick before `t` (strictly).
    fn before(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let t = ceil_second(t);
        self.cron
            .find_previous_occurrence(&t.with_timezone(&self.tz), false)
            .ok()
            .map(|d| floor_second(d.with_timezone(&Utc)))
    }
}

/// `t` without its fraction of a second: ticks are whole seconds.
/// The fields of a cron expression, seconds first (absent from a five-field
/// one), each with what it takes.
const FIELDS: [(&str, &str); 6] = [
    ("second", "0-59"),
    ("minute", "0-59"),
    ("hour", "0-23"),
    ("day-of-month", "1-31, L, W"),
    ("month", "1-12 or JAN-DEC"),
    ("day-of-week", "0-7 (0 and 7 are Sunday) or SUN-SAT, L, #"),
];

/// Which field of a five- or six-field `expression` croner refuses, said
/// as `its minute field '61' is not read (0-59)` (croner's own message,
/// `Component error: Number out of bounds.`, names none): each field is
/// parsed alone, the others `*`. `None` when no field fails alone.
fn wrong_field(parser: &CronParser, expression: &str) -> Option<String> {
    let words: Vec<&str> = expression.split_whitespace().collect();
    let fields = FIELDS.get(FIELDS.len().checked_sub(words.len())?..)?;
    words.iter().zip(fields).enumerate().find_map(|(i, (word, (field, takes)))| {
        let alone: Vec<&str> = (0..words.len()).map(|j| if j == i { *word } else { "*" }).collect();
        parser.parse(&alone.join(" ")).is_err().then(|| format!("its {field} field '{word}' is not read ({takes})"))
    })
}

fn floor_second(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp(t.timestamp(), 0).unwrap_or(t)
}

/// The first whole second at `t` or after.
fn ceil_second(t: DateTime<Utc>) -> DateTime<Utc> {
    let f = floor_second(t);
    if f == t {
        t
    } else {
        f + chrono::Duration::seconds(1)
    }
}

/// What one pass does with a due schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The ticks to send a message for, oldest first.
    pub send: Vec<DateTime<Utc>>,
    /// Missed ticks not sent (counted up to [`MAX_COUNTED`]).
    pub missed: u64,
    /// The schedule's next tick after this pass (`None`: it never fires again).
    pub next_at: Option<DateTime<Utc>>,
}

/// The ticks a pass at `now` sends for a schedule whose next tick is
/// `next_at`: those at most `grace` old, and of the older ones what
/// `catchup` says; and the tick after them.
pub fn plan(
    t: &Timetable,
    next_at: DateTime<Utc>,
    now: DateTime<Utc>,
    grace: chrono::Duration,
    catchup: Catchup,
) -> Plan {
    if next_at > now {
        return Plan { send: Vec::new(), missed: 0, next_at: Some(next_at) };
    }
    // (A tick, a whole second, is on time from this second on.)
    let on_time_from = ceil_second(now - grace);
    let mut send = Vec::new();
    let mut missed = 0;
    if next_at < on_time_from {
        let mut caught = Vec::new();
        let most = match catchup {
            Catchup::None => 0,
            Catchup::One => 1,
            Catchup::All => MAX_CATCHUP,
        };
        let mut cursor = on_time_from;
        while caught.len() < most {
            match t.before(cursor) {
                Some(tick) if tick >= next_at => {
                    caught.push(tick);
                    cursor = tick;
                }
                _ => break,
            }
        }
        let mut n = 0usize;
        let mut tick = Some(next_at);
        while let Some(x) = tick.filter(|x| *x < on_time_from && n < MAX_COUNTED) {
            n += 1;
            tick = t.next_after(x);
        }
        missed = n.saturating_sub(caught.len()) as u64;
        caught.reverse();
        send = caught;
    }
    let mut tick = t.at_or_after(next_at.max(on_time_from));
    while let Some(x) = tick.filter(|x| *x <= now) {
        if send.len() >= MAX_PER_PASS {
            return Plan { send, missed, next_at: Some(x) };
        }
        send.push(x);
        tick = t.next_after(x);
    }
    Plan { send, missed, next_at: tick }
}

/// A tick as messages carry it (their KEY's end, `{tick}` in the body):
/// RFC 3339 in UTC, to the second (`2026-11-27T19:30:00Z`).
pub fn tick_text(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// `body` with every `{tick}` replaced by the tick's text.
pub fn body_for(body: &[u8], tick: &str) -> Vec<u8> {
    const MARK: &[u8] = b"{tick}";
    let mut out = Vec::with_capacity(body.len());
    let mut rest = body;
    while let Some(i) = rest.windows(MARK.len()).position(|w| w == MARK) {
        out.extend_from_slice(&rest[..i]);
        out.extend_from_slice(tick.as_bytes());
        rest = &rest[i + MARK.len()..];
    }
    out.extend_from_slice(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn every_second() -> Timetable {
        Timetable::new("* * * * * *", "UTC").unwrap()
    }

    #[test]
    fn expressions_and_zones() {
        let t = Timetable::new("30 2 * * *", "Europe/Berlin").unwrap();
        // 02:30 in Berlin in winter is 01:30 UTC.
        assert_eq!(t.first_after(at("2026-01-10T12:00:00Z")).unwrap(), at("2026-01-11T01:30:00Z"));
        let h = Timetable::new("@hourly", "UTC").unwrap();
        assert_eq!(h.first_after(at("2026-01-10T12:00:00Z")).unwrap(), at("2026-01-10T13:00:00Z"));
        let s = Timetable::new("*/10 * * * * *", "UTC").unwrap();
        assert_eq!(s.first_after(at("2026-01-10T12:00:01Z")).unwrap(), at("2026-01-10T12:00:10Z"));
        assert!(Timetable::new("* * * *", "UTC").unwrap_err().contains("has 4 fields"));
        assert!(Timetable::new("61 * * * *", "UTC").unwrap_err().starts_with("cron expression '61 * * * *'"));
        // The refusal names the field croner refused, and what it takes.
        let wrong = |e: &str| Timetable::new(e, "UTC").unwrap_err();
        assert_eq!(
            wrong("61 * * * *"),
            "cron expression '61 * * * *': its minute field '61' is not read (0-59): Component error: Number out of \
             bounds."
        );
        assert!(wrong("0 25 * * *").contains("its hour field '25' is not read (0-23)"));
        assert!(wrong("0 0 * 13 *").contains("its month field '13' is not read (1-12 or JAN-DEC)"));
        assert!(wrong("0 0 * * FUN").contains("its day-of-week field 'FUN'"));
        assert!(wrong("70 0 0 * * *").contains("its second field '70' is not read (0-59)"));
        assert!(wrong("0 61 0 * * *").contains("its minute field '61'"));
        assert!(Timetable::new("* * * * *", "Mars/Olympus").unwrap_err().contains("unknown time zone 'Mars/Olympus'"));
        assert!(Timetable::new("* * * * *", "europe/berlin").unwrap_err().contains("did you mean Europe/Berlin?"));
        let e = Timetable::new("@every 10s", "UTC").unwrap_err();
        assert!(e.contains("no @every") && e.contains("*/10 * * * * *"), "{e}");
        assert!(Timetable::new("@DAILY", "UTC").is_ok());
        assert!(Timetable::new("0 0 0 1 1 * 2020", "UTC").unwrap_err().contains("has 7 fields"));
    }

    #[test]
    fn an_expression_that_never_fires_is_told_quickly() {
        let started = std::time::Instant::now();
        let t = Timetable::new("0 0 30 2 *", "UTC").unwrap();
        assert!(t.first_after(Utc::now()).unwrap_err().contains("never fires"));
        // (Leap days do fire.)
        assert!(Timetable::new("0 0 29 2 *", "UTC").unwrap().first_after(Utc::now()).is_ok());
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
    }

    #[test]
    fn clock_changes() {
        // 02:30 in Berlin: skipped when the clocks spring forward (sent at
        // 03:00 local), repeated when they fall back (sent once, the first).
        let t = Timetable::new("30 2 * * *", "Europe/Berlin").unwrap();
        let walk = |from: &str| {
            let mut x = at(from);
            (0..3)
                .map(|_| {
                    x = t.next_after(x).unwrap();
                    x
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            walk("2026-03-27T12:00:00Z"),
            [at("2026-03-28T01:30:00Z"), at("2026-03-29T01:00:00Z"), at("2026-03-30T00:30:00Z")]
        );
        assert_eq!(
            walk("2026-10-23T12:00:00Z"),
            [at("2026-10-24T00:30:00Z"), at("2026-10-25T00:30:00Z"), at("2026-10-26T01:30:00Z")]
        );
    }

    #[test]
    fn on_time_ticks_are_sent_whatever_catchup() {
        let t = every_second();
        let grace = chrono::Duration::seconds(60);
        for c in [Catchup::None, Catchup::One, Catchup::All] {
            let p = plan(&t, at("2026-01-10T12:00:00Z"), at("2026-01-10T12:00:02.5Z"), grace, c);
            assert_eq!(
                p.send,
                vec![at("2026-01-10T12:00:00Z"), at("2026-01-10T12:00:01Z"), at("2026-01-10T12:00:02Z")]
            );
            assert_eq!((p.missed, p.next_at), (0, Some(at("2026-01-10T12:00:03Z"))));
        }
        let p = plan(&t, at("2026-01-10T12:00:05Z"), at("2026-01-10T12:00:02Z"), grace, Catchup::None);
        assert_eq!(p, Plan { send: vec![], missed: 0, next_at: Some(at("2026-01-10T12:00:05Z")) });
    }

    #[test]
    fn within_a_second() {
        let t = every_second();
        assert_eq!(t.first_after(at("2026-01-10T12:00:00.3Z")).unwrap(), at("2026-01-10T12:00:01Z"));
        assert_eq!(t.first_after(at("2026-01-10T12:00:00Z")).unwrap(), at("2026-01-10T12:00:01Z"));
        // Missed and on time never overlap, whatever the fraction of `now`.
        for now in ["2026-01-10T12:00:10.6Z", "2026-01-10T12:00:10Z", "2026-01-10T12:00:10.000001Z"] {
            let p = plan(&t, at("2026-01-10T12:00:00Z"), at(now), chrono::Duration::seconds(2), Catchup::None);
            // On time: 12:00:08 (10.6 - 2 = 8.6: from 9), 09, 10.
            let first = p.send[0];
            assert_eq!(p.missed as i64, (first - at("2026-01-10T12:00:00Z")).num_seconds(), "{now}: {p:?}");
            assert_eq!(*p.send.last().unwrap(), at("2026-01-10T12:00:10Z"), "{now}");
            assert_eq!(p.next_at, Some(at("2026-01-10T12:00:11Z")), "{now}");
            assert!(p.send.iter().all(|t| t.timestamp_subsec_nanos() == 0));
            let one = plan(&t, at("2026-01-10T12:00:00Z"), at(now), chrono::Duration::seconds(2), Catchup::One);
            assert_eq!(one.send[0], first - chrono::Duration::seconds(1), "{now}: {one:?}");
            assert_eq!(one.missed, p.missed - 1);
        }
    }

    #[test]
    fn missed_ticks_follow_catchup() {
        let t = Timetable::new("0 * * * * *", "UTC").unwrap(); // every minute
        let grace = chrono::Duration::seconds(90);
        let (next, now) = (at("2026-01-10T12:00:00Z"), at("2026-01-10T12:10:30Z"));
        // On time: 12:09 and 12:10 (within 90 s); missed: 12:00 ... 12:08.
        let on_time = vec![at("2026-01-10T12:09:00Z"), at("2026-01-10T12:10:00Z")];
        let none = plan(&t, next, now, grace, Catchup::None);
        assert_eq!((none.send.clone(), none.missed), (on_time.clone(), 9));
        let one = plan(&t, next, now, grace, Catchup::One);
        assert_eq!(one.send, [vec![at("2026-01-10T12:08:00Z")], on_time.clone()].concat());
        assert_eq!(one.missed, 8);
        let all = plan(&t, next, now, grace, Catchup::All);
        assert_eq!(all.send.len(), 11);
        assert_eq!((all.send[0], all.missed), (next, 0));
        for p in [none, one, all] {
            assert_eq!(p.next_at, Some(at("2026-01-10T12:11:00Z")));
        }
    }

    #[test]
    fn catching_up_is_bounded() {
        let t = every_second();
        let grace = chrono::Duration::seconds(1);
        let next = at("2026-01-10T12:00:00Z");
        let now = next + chrono::Duration::seconds(3600);
        let all = plan(&t, next, now, grace, Catchup::All);
        // The latest 100 missed, then the two on time.
        assert_eq!(all.send.len(), MAX_CATCHUP + 2);
        assert_eq!(all.send[0], now - chrono::Duration::seconds(101));
        assert_eq!(all.missed, 3599 - MAX_CATCHUP as u64);
        // A longer outage: counted up to MAX_COUNTED.
        let long = plan(&t, next, next + chrono::Duration::days(2), grace, Catchup::None);
        assert_eq!(long.missed, MAX_COUNTED as u64);
        // Many on time: at most MAX_PER_PASS, the rest next pass.
        let wide =
            plan(&t, next, next + chrono::Duration::seconds(5000), chrono::Duration::seconds(6000), Catchup::None);
        assert_eq!(wide.send.len(), MAX_PER_PASS);
        assert_eq!(wide.next_at, Some(next + chrono::Duration::seconds(MAX_PER_PASS as i64)));
    }

    fn words(line: &[&str]) -> Vec<Vec<u8>> {
        line.iter().map(|w| w.as_bytes().to_vec()).collect()
    }

    #[test]
    fn qschedule_words() {
        let s = Schedule::parse(&words(&[
            "nightly",
            "jobs",
            "0 3 * * *",
            "run {tick}",
            "tz",
            "Europe/Paris",
            "CATCHUP",
            "one",
        ]))
        .unwrap();
        assert_eq!((s.tz.as_str(), s.key_prefix.as_str(), s.catchup), ("Europe/Paris", "nightly@", Catchup::One));
        let s = Schedule::parse(&words(&["n", "q", "@daily", "b", "KEY", "daily:"])).unwrap();
        assert_eq!((s.tz.as_str(), s.key_prefix.as_str(), s.catchup), ("UTC", "daily:", Catchup::None));
        assert_eq!(Schedule::parse(&words(&["n", "q", "@daily"])), Err(None));
        assert_eq!(Schedule::parse(&words(&["n", "q", "@daily", "b", "TZ"])), Err(None));
        let e = |line: &[&str]| Schedule::parse(&words(line)).unwrap_err().unwrap();
        assert_eq!(e(&["n", "q", "@daily", "b", "FOO", "x"]), "syntax error");
        assert_eq!(e(&["n", "q", "@daily", "b", "CATCHUP", "some"]), "CATCHUP must be none, one or all");
        assert!(e(&["n", "q", "@daily", "b", "TZ", "Mars/Olympus"]).contains("unknown time zone 'Mars/Olympus'"));
        assert!(e(&["n", "q", "every day", "b"]).contains("has 2 fields"));
        assert!(e(&[&"n".repeat(151), "q", "@daily", "b"]).contains("a schedule name must be 1 to 150 bytes"));
        assert!(e(&["n", "q", "@daily", "b", "KEY", &"k".repeat(181)]).contains("a KEY prefix must be 1 to 180"));
    }

    #[test]
    fn priority_group_and_delay_as_sends_and_each_option_once() {
        let s = Schedule::parse(&words(&["n", "q", "@daily", "b", "PRIORITY", "7", "group", "g1", "DELAY", "1500"]))
            .unwrap();
        assert_eq!((s.priority, s.group.as_deref(), s.delay_ms), (7, Some("g1"), 1500));
        let s = Schedule::parse(&words(&["n", "q", "@daily", "b"])).unwrap();
        assert_eq!((s.priority, s.group, s.delay_ms), (0, None, 0));
        let e = |line: &[&str]| Schedule::parse(&words(line)).unwrap_err().unwrap();
        assert_eq!(e(&["n", "q", "@daily", "b", "PRIORITY", "10"]), crate::policies::priority(10).unwrap_err());
        assert_eq!(e(&["n", "q", "@daily", "b", "PRIORITY", "high"]), "value is not an integer or out of range");
        assert_eq!(e(&["n", "q", "@daily", "b", "DELAY", "-1"]), "DELAY must be between 0 and 604800000 ms");
        assert!(e(&["n", "q", "@daily", "b", "GROUP", "a b"]).starts_with("a GROUP must be 1 to 200 bytes"));
        // Each option once: the last one given no longer wins silently.
        assert_eq!(e(&["n", "q", "@daily", "b", "TZ", "UTC", "tz", "Europe/Paris"]), given_twice("TZ"));
        assert_eq!(
            e(&["n", "q", "@daily", "b", "PRIORITY", "1", "KEY", "k:", "PRIORITY", "2"]),
            "syntax error: PRIORITY is given more than once"
        );
        for o in OPTIONS {
            let v = if o == "CATCHUP" {
                "one"
            } else if o == "TZ" {
                "UTC"
            } else {
                "1"
            };
            assert_eq!(e(&["n", "q", "@daily", "b", o, v, o, v]), given_twice(o), "{o}");
        }
    }

    #[test]
    fn ticks_as_text_and_in_bodies() {
        let tick = tick_text(Utc.with_ymd_and_hms(2026, 11, 27, 19, 30, 0).unwrap());
        assert_eq!(tick, "2026-11-27T19:30:00Z");
        assert_eq!(body_for(b"run {tick} and {tick}{", &tick), b"run 2026-11-27T19:30:00Z and 2026-11-27T19:30:00Z{");
        assert_eq!(body_for(b"\xff plain", &tick), b"\xff plain");
        assert_eq!(Catchup::parse("ALL"), Some(Catchup::All));
        assert_eq!(Catchup::parse("some"), None);
    }
}
