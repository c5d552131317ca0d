"""The third rig of the library measurements (#25): the DAZ-style test armature (tests/daz_rig.py; no DAZ rig or
motion is here) with two clips of its own, saved as a .blend.

    .venv/bin/python scripts/make_daz_proxy.py --folder ../shared/mocap/cmu --own 005_01,006_02 --save out/daz.blend

The own clips are CMU files retargeted onto it with their library note removed, so training counts them as the rig's
own motion (a user's two clips of their character); add the library afterwards with `nik import-bvh FOLDER --blend`.
Scene at 30 fps, as DAZ exports. Reads the folder (never copied); writes only the .blend.
"""

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "scripts"))
sys.path.insert(0, os.path.join(REPO, "tests"))

from addon_loader import isolate_user_resources, load_addon  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", required=True, help="BVH folder of the own clips")
    parser.add_argument("--own", required=True, help="comma-separated names of the own clips' files ('': none)")
    parser.add_argument("--save", required=True, help="the .blend to write")
    args = parser.parse_args()
    isolate_user_resources()
    load_addon()
    import bpy
    from daz_rig import daz_style_rig_with_clips

    from neural_ik.blender.rig.action_sources import SOURCE_PROPERTY

    daz, clips = daz_style_rig_with_clips(args.folder, [name for name in args.own.split(",") if name])
    for _name, imported in clips:
        for action_name in imported:
            del bpy.data.actions[action_name][SOURCE_PROPERTY]      # the rig's own clip from here on
    bpy.context.view_layer.objects.active = daz
    bpy.ops.wm.save_as_mainfile(filepath=os.path.abspath(args.save))
    print(f"{daz.name}: {len(bpy.data.actions)} own clips ({args.own}) saved in {args.save}")


if __name__ == "__main__":
    main()
