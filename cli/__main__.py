import sys

from postcast.cli import main

sys.exit(main())
