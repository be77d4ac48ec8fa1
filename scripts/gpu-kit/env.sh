# The environment of the tchrun GPU kit (issue 26), sourced by its bin/ wrappers and run.sh with
# KIT set to the kit's directory. POSIX sh. Nothing here needs the network or the build tree:
#   - libtorch: nothing to do, the installed wheel's tchrun-worker loads the torch of the
#     environment it is installed in (its $ORIGIN-relative RUNPATH), as on a user's cluster;
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
    export LD_LIBRARY_PATH="$KIT/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
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
