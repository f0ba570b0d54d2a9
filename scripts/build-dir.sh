# Sourced by the scripts: the build folder for AMPP_TORCH (one place, so build, test and train agree).
ampp_build_dir() {
  local root=$1 torch=${AMPP_TORCH:-wheel}
  if [ -n "${AMPP_BUILD_DIR:-}" ]; then echo "$AMPP_BUILD_DIR"
  elif [ "$torch" = wheel ]; then echo "$root/build"
  else echo "$root/build-$torch"; fi
}
