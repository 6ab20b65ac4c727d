import sys

from postcast.main import main

sys.exit(main())
