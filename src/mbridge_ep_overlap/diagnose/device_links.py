"""An extension whose CUDA device-link step ran for another GPU architecture than its objects were compiled for:
nvlink's ``SM Arch ('sm_NN') not found in 'FILE.o'``.

Contract
--------
``DeviceLinks.feed(text, where)`` keeps each ``nvlink warning : SM Arch ('sm_NN') not found in 'FILE'`` (also as
``nvlink error``), the architectures in order seen with the objects named for each (at most ``MAX_OBJECTS`` kept), and
the architectures the log's other lines show for the built library (``cuobjdump``'s ``...sm_NN.cubin`` lines, nvcc's
``-gencode arch=compute_NN,code=sm_NN`` / ``-arch=sm_NN`` flags). ``findings(links)`` gives one ``device-link:sm_NN``
finding per linked architecture from the ``DEVICE_LINK_ARCH`` row (``signatures.build``): the device-link step linked
for sm_NN (nvcc's default architecture when the link is given no ``-arch`` / ``-gencode``: sm_75 for CUDA 12 and 13)
while the objects hold code for other architectures only, so the library carries no usable device code for the GPUs it
was built for (kernels fail at run time with "no kernel image is available" or an invalid device function); the
objects named, how many, and the architectures compiled (from the flags, where the log shows them). The fix: give the
device-link step the same architectures as the compile (``-gencode`` / ``-arch`` in the dlink flags: setuptools'
``extra_compile_args['nvcc_dlink']``, CMake's ``CUDA_ARCHITECTURES``), or ``TORCH_CUDA_ARCH_LIST`` where the build
passes it to both. Never raises for what is in the lines.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from .report import Finding
from .signatures.build import DEVICE_LINK_ARCH

MAX_OBJECTS = 12
SHOWN_OBJECTS = 4
WARNING = re.compile(r"nvlink (?:warning|error)\s*:\s*SM Arch \('(?P<arch>sm_\d+[af]?)'\) not found in '(?P<file>[^']+)'")
CUBIN = re.compile(r"\.(?P<arch>sm_\d+[af]?)\.cubin\b")
FLAGS = re.compile(r"(?:code=|-arch=|--gpu-architecture=)(?P<arch>sm_\d+[af]?)\b|arch=compute_(?P<compute>\d+[af]?)")


@dataclass
class DeviceLink:
    arch: str
    where: str
    text: str
    objects: list[str] = field(default_factory=list)


class DeviceLinks:
    def __init__(self) -> None:
        self.links: list[DeviceLink] = []
        self.compiled: list[str] = []
        """Architectures the compile flags name (``sm_90``), in order seen."""
        self.in_library: list[str] = []
        """Architectures ``cuobjdump`` shows in the built library."""

    def feed(self, text: str, where: str) -> None:
        if "nvlink" in text and (m := WARNING.search(text)) is not None:
            link = next((x for x in self.links if x.arch == m["arch"]), None)
            if link is None:
                link = DeviceLink(m["arch"], where, text.strip()[:300])
                self.links.append(link)
            if m["file"] not in link.objects and len(link.objects) < MAX_OBJECTS:
                link.objects.append(m["file"])
        elif ".cubin" in text:
            for m in CUBIN.finditer(text):
                if m["arch"] not in self.in_library:
                    self.in_library.append(m["arch"])
        elif "code=" in text or "-arch=" in text or "gpu-architecture" in text:
            for m in FLAGS.finditer(text):
                arch = m["arch"] or f"sm_{m['compute']}"
                if arch not in self.compiled:
                    self.compiled.append(arch)

    def finish(self) -> None:
        """Nothing is held across sources."""


def findings(links: DeviceLinks) -> list[Finding]:
    out = []
    for link in links.links:
        compiled = [a for a in links.compiled if a != link.arch]
        cause = (f"The CUDA device-link step linked for {link.arch} (nvcc's default architecture when the link is given "
                 f"no -arch / -gencode) but {len(link.objects)} object(s) hold no {link.arch} code"
                 + (f" (they were compiled for {', '.join(compiled)})" if compiled else "")
                 + ": the library carries device code for the wrong architecture and its kernels fail on the GPUs it was "
                   "built for.")
        fix = (f"give the device-link step the architectures of the compile{' (' + ', '.join(compiled) + ')' if compiled else ''}: "
               f"-gencode / -arch in the dlink flags (setuptools' extra_compile_args['nvcc_dlink'], CMake's "
               f"CUDA_ARCHITECTURES), or TORCH_CUDA_ARCH_LIST where the build passes it to both steps; then rebuild")
        sig = dataclasses.replace(DEVICE_LINK_ARCH, id=f"{DEVICE_LINK_ARCH.id}:{link.arch}", cause=cause, fix=fix)
        f = Finding(sig)
        f.add(f"{link.where}: {link.text}")
        f.detail.append(f"objects without {link.arch} code: " + ", ".join(o.rsplit("/", 1)[-1] for o in
                                                                          link.objects[:SHOWN_OBJECTS])
                        + (f" and {len(link.objects) - SHOWN_OBJECTS} more" if len(link.objects) > SHOWN_OBJECTS else ""))
        if links.in_library:
            f.detail.append(f"the built library holds code for: {', '.join(links.in_library)} (cuobjdump)"
                            + (f": the linked {link.arch} only" if links.in_library == [link.arch] else ""))
        out.append(f)
    return out
