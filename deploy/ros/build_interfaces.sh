#!/usr/bin/env bash
# Build thor_interfaces (the Plan and RunPlan actions and the Plan service of `thor ros`) and
# install it under PREFIX (default: build/ros/install), then:
#     source PREFIX/share/thor_interfaces/local_setup.bash
# With a ROS 2 install sourced (apt on a Jetson: ROS_DISTRO is set and colcon is there) it is a
# plain colcon build. Otherwise it builds against the ROS 2 wheels of the `ros` extra in the
# Python environment of $PYTHON (default: .venv/bin/python, else python3) with cmake and a C/C++
# compiler, as colcon would.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
prefix="$(realpath -m "${1:-$root/build/ros/install}")"
work="$(dirname "$prefix")/work"
if [ -n "${ROS_DISTRO:-}" ] && command -v colcon >/dev/null 2>&1; then
    mkdir -p "$work"
    cd "$work"
    colcon build --merge-install --base-paths "$here/thor_interfaces" --install-base "$prefix" \
        --build-base "$work/build"
    echo "built: source $prefix/share/thor_interfaces/local_setup.bash"
    exit 0
fi
python="${PYTHON:-}"
if [ -z "$python" ]; then
    python=python3
    if [ -x "$root/.venv/bin/python" ]; then python="$root/.venv/bin/python"; fi
fi
env_prefix="$("$python" -c 'import sys; print(sys.prefix)')"
if [ ! -d "$env_prefix/share/rosidl_default_generators" ]; then
    echo "build_interfaces: no ROS 2 sourced, no rosidl_default_generators in $env_prefix:" >&2
    echo "  pip install 'thor-runtime[ros]' there (x86_64)," >&2
    echo "  or source /opt/ros/<distro>/setup.bash" >&2
    exit 2
fi
for tool in cmake make cc c++; do
    command -v "$tool" >/dev/null 2>&1 || { echo "build_interfaces: $tool is needed" >&2; exit 2; }
done
export PATH="$env_prefix/bin:$PATH" AMENT_PREFIX_PATH="$env_prefix" CMAKE_PREFIX_PATH="$env_prefix"
rm -rf "$work"
mkdir -p "$work"
cmake -S "$here/thor_interfaces" -B "$work" -DCMAKE_INSTALL_PREFIX="$prefix" \
    -DCMAKE_PROJECT_INCLUDE="$here/wheel_paths.cmake" \
    -DPython3_EXECUTABLE="$env_prefix/bin/python" \
    -DBUILD_TESTING=OFF > "$work.log" 2>&1 || { tail -40 "$work.log" >&2; exit 1; }
cmake --build "$work" -j "$(nproc)" >> "$work.log" 2>&1 || { tail -40 "$work.log" >&2; exit 1; }
cmake --install "$work" >> "$work.log" 2>&1 || { tail -40 "$work.log" >&2; exit 1; }
echo "built: source $prefix/share/thor_interfaces/local_setup.bash"
