#!/usr/bin/env bash
# Installs mwproxy, mwmq and mwload with what goes with them — man pages and
# shell completions made from their command lines (the mwdist binary), and
# for the two services a commented default configuration, a systemd unit and
# a sysusers.d entry — or builds Debian packages of the same files.
#
#   scripts/dist.sh install       into $DESTDIR$PREFIX (make install)
#   scripts/dist.sh uninstall     removes what install put there (make uninstall)
#   scripts/dist.sh deb [OUTDIR]  target/debian/*.deb (make deb)
#
# Settings (environment): BIN_DIR, where the built binaries are
# (target/release; the tests give target/debug); PREFIX (/usr/local),
# SYSCONFDIR ($PREFIX/etc, /etc when PREFIX is /usr), UNITDIR
# ($PREFIX/lib/systemd/system), DESTDIR (a staging root, empty by default);
# for deb, DEB_COMPRESS (xz; the tests take none, faster) and MAINTAINER.
#
# Nothing here builds: make install and make deb build the release binaries
# first. A package is the tree `install` makes for PREFIX=/usr, with
# DEBIAN/ control files (packaging/debian/) and dpkg-deb --root-owner-group,
# so no fakeroot, debhelper or cargo-deb is needed (docs/install.md says why).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN_DIR=${BIN_DIR:-target/release}
PREFIX=${PREFIX:-/usr/local}
if [ "$PREFIX" = /usr ]; then SYSCONFDIR=${SYSCONFDIR:-/etc}; else SYSCONFDIR=${SYSCONFDIR:-$PREFIX/etc}; fi
UNITDIR=${UNITDIR:-$PREFIX/lib/systemd/system}
DESTDIR=${DESTDIR:-}
PROGRAMS=(mwproxy mwmq mwload)

die() { echo "dist.sh: $*" >&2; exit 1; }
is_service() { [ "$1" = mwproxy ] || [ "$1" = mwmq ]; }

# Scratch directories, removed on exit.
scratch=()
trap 'rm -rf "${scratch[@]}"' EXIT

# The man pages and completions of every program, made once into $gen.
gen=""
generate() {
  [ -n "$gen" ] && return 0
  for p in "${PROGRAMS[@]}" mwdist; do
    [ -x "$BIN_DIR/$p" ] || die "$BIN_DIR/$p is not built: run make build (or cargo build --release --workspace --bins)"
  done
  gen=$(mktemp -d /tmp/mwdist.XXXXXX)
  scratch+=("$gen")
  "$BIN_DIR/mwdist" "$gen" --sysconfdir "$SYSCONFDIR"
}

# Copies $1 to $2 with the install's paths put in.
subst() {
  sed -e "s|@BINDIR@|$PREFIX/bin|g" -e "s|@SYSCONFDIR@|$SYSCONFDIR|g" "$1" > "$2"
}

# Where zsh looks: Debian's vendor directory for /usr, site-functions elsewhere.
zsh_dir() { if [ "$PREFIX" = /usr ]; then echo "$PREFIX/share/zsh/vendor-completions"; else echo "$PREFIX/share/zsh/site-functions"; fi; }

# The files of program $1, as "source destination mode" lines (destination without $DESTDIR).
files_of() {
  local p=$1 page
  echo "$BIN_DIR/$p $PREFIX/bin/$p 755"
  for page in "$gen/man/man1/$p.1" "$gen/man/man1/$p"-*.1; do
    [ -f "$page" ] && echo "$page $PREFIX/share/man/man1/$(basename "$page").gz 644"
  done
  echo "$gen/completions/bash/$p $PREFIX/share/bash-completion/completions/$p 644"
  echo "$gen/completions/zsh/_$p $(zsh_dir)/_$p 644"
  echo "$gen/completions/fish/$p.fish $PREFIX/share/fish/vendor_completions.d/$p.fish 644"
  if is_service "$p"; then
    echo "packaging/$p/$p.service $UNITDIR/$p.service 644"
    echo "packaging/$p/$p.sysusers $PREFIX/lib/sysusers.d/$p.conf 644"
    echo "packaging/$p/$p.toml $SYSCONFDIR/$p/$p.toml 644"
  fi
}

# Installs program $1 under root $2.
install_program() {
  local p=$1 root=$2 src dst mode
  while read -r src dst mode; do
    install -d "$root$(dirname "$dst")"
    case "$dst" in
      */bin/*)
        # The DWARF goes (most of the 40-60 MB); the symbols stay, for backtraces.
        install -m "$mode" "$src" "$root$dst"
        strip --strip-debug "$root$dst"
        ;;
      *.gz) gzip -9n < "$src" > "$root$dst" && chmod "$mode" "$root$dst" ;;
      *.toml)
        subst "$src" "$root$dst.default" && chmod "$mode" "$root$dst.default"
        if [ -e "$root$dst" ] && ! cmp -s "$root$dst" "$root$dst.default"; then
          # make install never overwrites a changed configuration; the new default goes beside it.
          echo "kept $root$dst (changed); the default is in $root$dst.default"
        else
          mv "$root$dst.default" "$root$dst"
        fi
        ;;
      *.service) subst "$src" "$root$dst" && chmod "$mode" "$root$dst" ;;
      *) install -m "$mode" "$src" "$root$dst" ;;
    esac
  done < <(files_of "$p")
}

cmd_install() {
  generate
  for p in "${PROGRAMS[@]}"; do install_program "$p" "$DESTDIR"; done
  echo "installed ${PROGRAMS[*]} under $DESTDIR$PREFIX (configuration in $DESTDIR$SYSCONFDIR, units in $DESTDIR$UNITDIR)"
  if [ -z "$DESTDIR" ]; then
    echo "next: systemd-sysusers; systemctl daemon-reload; edit $SYSCONFDIR/mwproxy/mwproxy.toml; systemctl enable --now mwproxy"
  fi
}

cmd_uninstall() {
  generate
  local p src dst mode
  for p in "${PROGRAMS[@]}"; do
    while read -r src dst mode; do
      case "$dst" in
        *.toml) # a changed configuration stays
          rm -f "$DESTDIR$dst.default"
          if [ -f "$DESTDIR$dst" ] && subst "$src" "$gen/cmp" && cmp -s "$gen/cmp" "$DESTDIR$dst"; then
            rm -f "$DESTDIR$dst"
          elif [ -f "$DESTDIR$dst" ]; then
            echo "kept $DESTDIR$dst (changed)"
          fi
          rmdir "$DESTDIR$(dirname "$dst")" 2>/dev/null || true ;;
        *) rm -f "$DESTDIR$dst" ;;
      esac
    done < <(files_of "$p")
  done
}

# The Depends of a binary: the C library version its symbols need, libgcc_s when it links it.
depends_of() {
  local glibc deps headers
  glibc=$(objdump -T "$1" | grep -oE 'GLIBC_[0-9]+(\.[0-9]+)+' | sed 's/GLIBC_//' | sort -uV | tail -1)
  deps="libc6${glibc:+ (>= $glibc)}"
  # Read whole before matching: `objdump | grep -q` under pipefail failed at
  # random (grep quits at the first match, objdump dies of SIGPIPE).
  headers=$(objdump -p "$1")
  if [[ $headers =~ NEEDED\ +libgcc_s ]]; then deps="$deps, libgcc-s1"; fi
  echo "$deps"
}

# The control file's fields of package $1 that are its own.
control_of() {
  case "$1" in
    mwproxy) cat <<'EOF'
Recommends: memcached
Description: memcached middleware: consistent hashing, replication, sharded multi-gets
 mwproxy sits between memcached clients and many memcached servers: it
 places keys by ketama (as libmemcached and twemproxy do), replicates them,
 shards multi-gets, fails over and repairs, and measures itself (Prometheus
 /metrics, results files). It also reads twemproxy's configuration and
 command line. The package installs a systemd unit (not enabled) and a
 commented configuration in /etc/mwproxy/.
EOF
    ;;
    mwmq) cat <<'EOF'
Recommends: postgresql
Suggests: redis-tools
Description: message queue over PostgreSQL that Redis clients speak to
 mwmq keeps queues and Redis Streams in PostgreSQL and speaks RESP, so any
 Redis client can send, receive and acknowledge messages, with leases, dead
 letters, users and rights, and measures itself (Prometheus /metrics, a /ui
 page of the queues). The package installs a systemd unit (not enabled) and
 a commented configuration in /etc/mwmq/ pointing at the local PostgreSQL.
EOF
    ;;
    mwload) cat <<'EOF'
Description: memcached and RESP load generator that measures right
 mwload drives memcached servers, mwproxy or mwmq closed or open loop,
 without coordinated omission, and reports throughput and response-time
 percentiles from HDR histograms per window.
EOF
    ;;
  esac
}

# Builds the package of program $1 from the tree install makes, into $2.
build_deb() {
  local p=$1 out=$2 root version arch
  root=$(mktemp -d /tmp/mwdist-deb.XXXXXX)
  chmod 755 "$root"
  scratch+=("$root")
  install_program "$p" "$root"
  version=$("$root/usr/bin/$p" --version | awk '{print $2}')
  arch=$(dpkg --print-architecture)
  install -d "$root/usr/share/doc/$p" "$root/DEBIAN"
  install -m 644 packaging/debian/copyright "$root/usr/share/doc/$p/copyright"
  printf '%s (%s) unstable; urgency=medium\n\n  * Built from the mwlab source tree.\n\n -- %s  %s\n' \
    "$p" "$version" "$MAINTAINER" "$(date -R -d @"${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}")" |
    gzip -9n > "$root/usr/share/doc/$p/changelog.gz"
  {
    echo "Package: $p"
    echo "Version: $version"
    echo "Architecture: $arch"
    echo "Maintainer: $MAINTAINER"
    echo "Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)"
    echo "Depends: $(depends_of "$root/usr/bin/$p")"
    echo "Section: net"
    echo "Priority: optional"
    control_of "$p"
  } > "$root/DEBIAN/control"
  if is_service "$p"; then
    echo "/etc/$p/$p.toml" > "$root/DEBIAN/conffiles"
    for s in postinst prerm postrm; do
      sed "s/@NAME@/$p/g" "packaging/debian/$s" > "$root/DEBIAN/$s"
      chmod 755 "$root/DEBIAN/$s"
    done
  fi
  (cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) > "$root/DEBIAN/md5sums"
  dpkg-deb --root-owner-group -Z"$DEB_COMPRESS" --build "$root" "$out/${p}_${version}_${arch}.deb" >/dev/null
  rm -rf "$root"
  echo "$out/${p}_${version}_${arch}.deb"
}

cmd_deb() {
  local out=${1:-target/debian}
  PREFIX=/usr SYSCONFDIR=/etc UNITDIR=/usr/lib/systemd/system
  DEB_COMPRESS=${DEB_COMPRESS:-xz}
  MAINTAINER=${MAINTAINER:-mwlab maintainers <mwlab@localhost>}
  for t in dpkg-deb strip objdump gzip; do command -v "$t" >/dev/null || die "$t is missing (make deb installs it)"; done
  generate
  mkdir -p "$out"
  rm -f "$out"/*.deb
  for p in "${PROGRAMS[@]}"; do build_deb "$p" "$out"; done
}

case "${1:-}" in
  install) cmd_install ;;
  uninstall) cmd_uninstall ;;
  deb) shift; cmd_deb "$@" ;;
  *) die "usage: scripts/dist.sh install|uninstall|deb [OUTDIR]" ;;
esac
