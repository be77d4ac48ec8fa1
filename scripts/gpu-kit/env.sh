# The environment of the tchrun GPU kit (issue 26), sourced by its bin/ wrappers and run.sh with
# KIT set to the kit's directory. POSIX sh. Nothing here needs the network or the build tree:
#   - libtorch from the Python that has torch (TCHRUN_KIT_PYTHON, default python3): its
#     torch/lib goes first on LD_LIBRARY_PATH (the binaries' RUNPATH names the build machine's
#     .venv, which is not there); TCHRUN_KIT_TORCH_LIB skips the lookup when already known;
#   - the kit's OpenMPI: openmpi/lib on LD_LIBRARY_PATH, openmpi/bin first on PATH (tchrun
#     starts `mpirun` from PATH), and its install directories moved to the kit: OPAL_PREFIX and
#     the OPAL_* directories (OpenMPI 4.1's relocation), the MCA plugin path, and PMIx's own
#     directories and plugin path (PMIX_*), so neither looks under /usr or /etc; hwloc's
#     plugin path too (HWLOC_PLUGINS_PATH: an empty folder).
# Only the processes started through the wrappers get this: Python (the reference benchmark,
# make_digits.py) keeps the machine's own libraries.
if [ -z "${KIT:-}" ] || [ ! -f "$KIT/env.sh" ]; then
    echo "tchrun kit: env.sh needs KIT set to the kit's directory" >&2
    return 2 2>/dev/null || exit 2
fi
if [ "${TCHRUN_KIT_ENV:-}" != "$KIT" ]; then
    if [ -z "${TCHRUN_KIT_TORCH_LIB:-}" ]; then
        TCHRUN_KIT_TORCH_LIB="$("${TCHRUN_KIT_PYTHON:-python3}" -c 'import importlib.util, os
s = importlib.util.find_spec("torch")
print(os.path.join(os.path.dirname(s.origin), "lib") if s and s.origin else "")' 2>/dev/null)"
        if [ -z "$TCHRUN_KIT_TORCH_LIB" ] || [ ! -e "$TCHRUN_KIT_TORCH_LIB/libtorch_cpu.so" ]; then
            echo "tchrun kit: no libtorch: '${TCHRUN_KIT_PYTHON:-python3}' has no torch with lib/libtorch_cpu.so; set TCHRUN_KIT_PYTHON to a Python with torch 2.11 (run.sh --python)" >&2
            return 2 2>/dev/null || exit 2
        fi
    fi
    export TCHRUN_KIT_TORCH_LIB
    export LD_LIBRARY_PATH="$TCHRUN_KIT_TORCH_LIB:$KIT/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PATH="$KIT/openmpi/bin${PATH:+:$PATH}"
    export OPAL_PREFIX="$KIT/openmpi"
    export OPAL_EXEC_PREFIX="$KIT/openmpi"
    export OPAL_BINDIR="$KIT/openmpi/bin"
    export OPAL_LIBDIR="$KIT/openmpi/lib"
    export OPAL_LIBEXECDIR="$KIT/openmpi/bin"
    export OPAL_DATAROOTDIR="$KIT/openmpi/share"
    export OPAL_DATADIR="$KIT/openmpi/share"
    export OPAL_PKGDATADIR="$KIT/openmpi/share/openmpi"
    export OPAL_PKGLIBDIR="$KIT/openmpi/lib/openmpi"
    export OPAL_SYSCONFDIR="$KIT/openmpi/etc"
    export OMPI_MCA_mca_base_component_path="$KIT/openmpi/lib/openmpi"
    export OMPI_MCA_mca_base_param_files="$KIT/openmpi/etc/openmpi-mca-params.conf"
    export OMPI_MCA_orte_default_hostfile="$KIT/openmpi/etc/openmpi-default-hostfile"
    export PMIX_PREFIX="$KIT/openmpi"
    export PMIX_INSTALL_PREFIX="$KIT/openmpi"
    export PMIX_LIBDIR="$KIT/openmpi/lib"
    export PMIX_PKGLIBDIR="$KIT/openmpi/lib/pmix"
    export PMIX_DATADIR="$KIT/openmpi/share"
    export PMIX_PKGDATADIR="$KIT/openmpi/share/pmix"
    export PMIX_SYSCONFDIR="$KIT/openmpi/etc"
    export PMIX_MCA_mca_base_component_path="$KIT/openmpi/lib/pmix"
    # hwloc's optional plugins: none (not the machine's, built for another libhwloc).
    export HWLOC_PLUGINS_PATH="$KIT/openmpi/lib/hwloc"
    export TCHRUN_KIT_ENV="$KIT"
fi
