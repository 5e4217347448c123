#!/bin/bash
# The `uring` CTest fixture (tests/fsd/CMakeLists.txt): `set STATE` turns the fuse
# module's enable_uring on for the io_uring runs of the fsd and reliability tests and
# remembers the old value in STATE; `restore STATE` puts it back. Without root or
# without the parameter it changes nothing (the io_uring runs then skip) and succeeds.
set -u
param=/sys/module/fuse/parameters/enable_uring
action=$1 state=$2
case $action in
set)
  rm -f "$state"
  if [ ! -e "$param" ]; then echo "no $param: the io_uring runs will skip"; exit 0; fi
  if [ "$(id -u)" -ne 0 ]; then echo "not root: enable_uring stays $(cat $param)"; exit 0; fi
  cat "$param" >"$state"
  echo Y >"$param" || { echo "cannot set $param"; exit 1; }
  echo "enable_uring: $(cat "$state") -> $(cat $param)"
  ;;
restore)
  [ -f "$state" ] || exit 0
  cat "$state" >"$param" || { echo "cannot restore $param to $(cat "$state")"; exit 1; }
  echo "enable_uring restored to $(cat $param)"
  rm -f "$state"
  ;;
*) echo "usage: $0 set|restore STATE" >&2; exit 2 ;;
esac
